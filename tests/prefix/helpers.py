"""Helpers for the memory-sharing tests: transformers' greedy tokens, an LLM on the CPU."""

from __future__ import annotations

import torch

from folio import LLM, SamplingParams


def hf_greedy(path: str, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    outs = []
    for ids in prompts:
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=0,
        )
        outs.append(out[0, len(ids):].tolist())
    return outs


def make_llm(path: str, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 256)
    return LLM(model=path, dtype="float32", device="cpu", **kwargs)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def token_prompts(prompts: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": p} for p in prompts]
