"""transformers' greedy `generate` on a checkpoint folder: the reference folio's tokens are held to."""

from __future__ import annotations

import torch


def hf_greedy_with_logprobs(path: str, prompts: list[list[int]], max_new: int) -> list[tuple[list[int], torch.Tensor]]:
    """Per prompt, alone: its max_new greedy tokens (EOS off) and their log-probs [steps, vocab]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # compare full length; EOS is tested elsewhere
    refs = []
    for ids in prompts:
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        tokens = out.sequences[0, len(ids):].tolist()
        logprobs = torch.log_softmax(torch.stack(out.logits)[:, 0].float(), dim=-1)
        refs.append((tokens, logprobs))
    return refs


def hf_greedy(path: str, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """Per prompt, alone: its max_new greedy tokens (EOS off)."""
    return [tokens for tokens, _ in hf_greedy_with_logprobs(path, prompts, max_new)]
