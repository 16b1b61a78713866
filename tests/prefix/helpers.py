"""Helpers for the memory-sharing tests: transformers' greedy tokens, an LLM on the CPU."""

from __future__ import annotations

from folio import LLM, SamplingParams
from tests.helpers.reference import hf_greedy  # noqa: F401 - the prefix tests import it from here


def make_llm(path: str, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 256)
    return LLM(model=path, dtype="float32", device="cpu", **kwargs)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def token_prompts(prompts: list[list[int]]) -> list[dict]:
    return [{"prompt_token_ids": p} for p in prompts]
