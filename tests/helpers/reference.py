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


def tokens_and_logprobs(outputs: list) -> list[tuple]:
    """Each RequestOutput's first completion as (token ids, its prompt log-probs then its sampled
    log-probs, each position's entries sorted by token id)."""
    return [(list(o.outputs[0].token_ids), [sorted(d.items()) if d else d
                                            for d in [*(o.prompt_logprobs or []), *(o.outputs[0].logprobs or [])]])
            for o in outputs]


def assert_same_tokens_and_logprobs(got: list[tuple], want: list[tuple], atol: float = 1e-4) -> None:
    """tokens_and_logprobs of two runs: the same tokens, the same top tokens a position, their
    log-probs within atol."""
    assert len(got) == len(want)
    for (tokens_a, lp_a), (tokens_b, lp_b) in zip(got, want):
        assert tokens_a == tokens_b
        assert len(lp_a) == len(lp_b)
        for a, b in zip(lp_a, lp_b):
            if a is None or b is None:
                assert a == b
                continue
            assert [t for t, _ in a] == [t for t, _ in b]
            for (_, x), (_, y) in zip(a, b):
                assert abs(x.logprob - y.logprob) < atol
