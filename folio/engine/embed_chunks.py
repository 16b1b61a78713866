"""How AsyncLLM.embed cuts one request's prompts into the commands it sends the engine one at a
time, so that generation steps run between them (a request of many long inputs once held the
engine for tens of seconds in one command: session 27's server review)."""

from __future__ import annotations


def embed_chunks(prompts: list[list[int]], max_tokens: int, max_prompts: int) -> list[list[list[int]]]:
    """The prompts in order, in chunks of at most one step's tokens (max_num_batched_tokens) and
    max_prompts (max_num_seqs) prompts, a longer prompt alone: the pooler's own cuts
    (Pooler._batches), so a chunk is a batch it would have pooled anyway, with the same vectors."""
    chunks: list[list[list[int]]] = [[]]
    tokens = 0
    for prompt in prompts:
        if chunks[-1] and (tokens + len(prompt) > max_tokens or len(chunks[-1]) >= max_prompts):
            chunks.append([])
            tokens = 0
        chunks[-1].append(prompt)
        tokens += len(prompt)
    return chunks
