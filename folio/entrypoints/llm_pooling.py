"""LLM.encode and LLM.score's checks, score's pairing rule, and the cosine both it and /v1/score use.

folio pools a decoder's final hidden states (worker/pooler.py): one vector per prompt, last token
or mean. So `encode` honours vLLM's "embed" pooling task only, and `score` is the cosine similarity
of two prompts' embeddings, as /v1/score computes it (entrypoints/openai/serving_score.py); there
is no classification head, hence no cross-encoder score, no classify and no reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# vLLM's LLM.encode pooling tasks; folio's pooler makes "embed" only (None: "embed", vLLM's
# choice for a model that can embed).
SUPPORTED_POOLING_TASKS = ("embed",)
VLLM_POOLING_TASKS = ("embed", "encode", "token_embed", "classify", "token_classify", "score")


@dataclass(frozen=True)
class PooledPrompt:
    """A prompt as it was pooled: its text (None for token prompts), the token ids the model read
    (after truncation) and its vector [hidden]."""

    text: str | None
    token_ids: list[int]
    vector: list[float]


def check_pooling_task(pooling_task: object) -> None:
    if pooling_task is None or pooling_task in SUPPORTED_POOLING_TASKS:
        return
    if pooling_task in VLLM_POOLING_TASKS:
        raise ValueError(
            f"pooling_task={pooling_task!r} is not supported: folio pools one vector per prompt from a "
            "decoder's final hidden states (pooling_task='embed'); it has no per-token outputs and no "
            "classification or score head.")
    raise ValueError(f"pooling_task must be one of {VLLM_POOLING_TASKS} (folio serves 'embed'), "
                     f"got {pooling_task!r}.")


def check_no_adapter(lora_request: object, method: str) -> None:
    """Pooling runs the base model (worker/pooler.py), so an adapter's embeddings would silently be
    the base model's: any adapter is refused, as /v1/embeddings and /v1/score refuse one."""
    entries = lora_request if isinstance(lora_request, (list, tuple)) else [lora_request]
    if any(entry is not None for entry in entries):
        raise ValueError(f"LLM.{method} does not take a lora_request: folio pools with the base model only, "
                         "so an adapter's outputs would be the base model's.")


def score_pairs(num_first: int, num_second: int) -> list[tuple[int, int]]:
    """vLLM's pairing rule, as (index into data_1, index into data_2): 1 to 1, 1 to N (the one
    first prompt against each second one) or N to N (in order)."""
    if num_first == 0:
        raise ValueError("data_1 is empty: at least one prompt to score must be given.")
    if num_second == 0:
        raise ValueError("data_2 is empty: at least one prompt to score against must be given.")
    if num_first > 1 and num_first != num_second:
        raise ValueError(f"data_1 has {num_first} prompts and data_2 has {num_second}: pass one prompt as "
                         "data_1 (1 to N), or as many as data_2 (N to N).")
    return [(0 if num_first == 1 else i, i) for i in range(num_second)]


def check_score_texts(prompts: Sequence[object], name: str) -> None:
    """An empty text is refused, as /v1/score refuses it (it would score the special tokens alone)."""
    for i, prompt in enumerate(prompts):
        text = prompt.get("prompt") if isinstance(prompt, dict) and "prompt_token_ids" not in prompt else prompt
        if text == "":
            raise ValueError(f"{name}[{i}] is empty: texts to score must not be empty.")


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors (LLM.score and /v1/score both call this one, so both
    give the same float for the same embeddings)."""
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
