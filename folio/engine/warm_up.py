"""A served engine's warm-up: a few short requests run before it says it is ready.

The first steps of shapes an engine has not run yet pay one-time costs: Triton kernels loaded
(or compiled) for new specialisations, cuBLAS heuristics, the caching allocator growing. An
offline benchmark hides them in an untimed warm-up run; a server has none, so its first clients
paid them: W1 through HTTP on an H100 (docs/perf-notes.md, session 10) ran at 16,247 output
tok/s with a mean time to first token of 1.57 s on a fresh server; 8 short requests first (the
offline benchmarks' warm-up) gave 16,531 tok/s and 0.69 s, and the warm-up below 16,794. It is
shaped like a busy server's first seconds: a lone long prompt (a quarter of max_num_batched_tokens,
prefilled in a step of its own: the long-chunk prefill kernel, which a step packed with many
sequences never takes; on a fresh machine it was compiled inside the first W1 run, session 21),
then up to 64 requests whose prompts fill 1.25 scheduler steps (max_num_batched_tokens), so one
full prefill chunk, a mixed chunk + decode step and decode batches of many sizes run; 8 new tokens
each, greedy and sampled.

Its requests run through the ordinary scheduler, so they appear in the engine's counters (up to
65 requests, ~1.5 x max_num_batched_tokens prompt tokens) and their blocks may stay in the
prefix cache (random tokens under a salt of their own: no client prompt can match them); the
sampler's generator is put back, so with `--seed` unseeded requests draw as they would without
it. FOLIO_WARM_UP=0 skips it.
"""

from __future__ import annotations

import os
import random
import time
from typing import TYPE_CHECKING

from folio.logger import init_logger
from folio.sampling_params import SamplingParams

if TYPE_CHECKING:
    from folio.engine.llm_engine import LLMEngine

logger = init_logger(__name__)

REQUESTS = 64  # at most; never more than max_num_seqs
OUTPUT_LEN = 8
FILL = 1.25  # prompt tokens in all, in units of max_num_batched_tokens: a full chunk, then a mixed step
LONG = 0.25  # the lone long prompt's length, in units of max_num_batched_tokens
SALT = "folio-warm-up"


def wants_warm_up(engine: LLMEngine) -> bool:
    """On a GPU (where the one-time costs are), unless FOLIO_WARM_UP=0."""
    return os.environ.get("FOLIO_WARM_UP", "1") != "0" and engine.config.device.device == "cuda"


def warm_up(engine: LLMEngine, force: bool = False) -> float:
    """Run the warm-up requests to completion; returns the seconds it took (0.0 when skipped).
    The engine must have no requests of its own yet. A warm-up that fails (a model that cannot
    generate, a context too short for it) is logged and abandoned: it never keeps a server down."""
    if not (force or wants_warm_up(engine)):
        return 0.0
    if engine.has_unfinished_requests():
        raise RuntimeError("warm_up: the engine already has requests; warm it up before serving.")
    start = time.perf_counter()
    sampler = getattr(getattr(engine, "runner", None), "sampler", None)
    generator_state = sampler.generator.get_state() if sampler is not None else None
    ids: list[str] = []
    try:
        _run(engine, ids)
    except Exception as e:  # noqa: BLE001 - the warm-up is an optimisation; serving goes on without it
        logger.warning("Warm-up abandoned (%s: %s); serving without it.", type(e).__name__, e)
        engine.abort_request(ids)
        return 0.0
    finally:
        if generator_state is not None:  # unseeded requests draw as if there had been no warm-up
            sampler.generator.set_state(generator_state)
    elapsed = time.perf_counter() - start
    logger.info("Warmed up in %.2f s (%d requests: a lone long prompt, then short ones; counted in the engine's stats)",
                elapsed, len(ids))
    return elapsed


def _run(engine: LLMEngine, ids: list[str]) -> None:
    """Add the requests (their ids go into `ids` as they are added) and step until all finish."""
    rng = random.Random(12345)
    vocab = min(engine.config.model.vocab_size, 10001)
    max_model_len = engine.config.model.max_model_len
    output_len = max(1, min(OUTPUT_LEN, max_model_len // 2))
    max_len = max(1, max_model_len - output_len)
    budget = engine.config.scheduler.max_num_batched_tokens
    count = max(1, min(REQUESTS, engine.config.scheduler.max_num_seqs))

    def add(name: str, length: int, temperature: float, seed: int) -> None:
        prompt = [rng.randrange(vocab) for _ in range(min(max_len, max(1, length)))]
        params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=temperature, seed=seed)
        ids.append(f"{SALT}-{name}")
        engine.add_request(ids[-1], {"prompt_token_ids": prompt, "cache_salt": SALT}, params)

    add("long", int(LONG * budget), 0.0, 0)
    engine.step()  # its prefill alone
    mean = FILL * budget / count
    for i in range(count):
        add(str(i), int(mean * (0.25 + 1.5 * rng.random())), 0.0 if i % 2 == 0 else 0.6, i)  # lengths of every parity
    while engine.has_unfinished_requests():
        engine.step()
