"""Which small steps run their attention as one decode sequence per token, to replay a decode
CUDA graph instead of launching the forward kernel by kernel.

A step with prompt tokens runs eagerly: ~250 Python kernel launches for the 0.6B, ~15 ms of host
time where a short prompt's GPU work is ~3 ms (session 23, H100: time to first token of a
1,024-token prompt 18.4-19.3 ms against 3.09 ms of device time). StepInputBuilder's per-token
sequences (made for speculative verify steps) turn a step of T tokens into T one-token
sequences, each with its context up to itself: the same causal attention, decode-only, so the
decode graph of the bucket >= T replays it. The price is the attention's reads: a chunk of L new
tokens on C cached ones is read L * (C + L / 2) times over (once per token) instead of about once
per 64-row query block. `takes_per_token_step` allows it while that stays under a budget of
token reads a layer: PER_TOKEN_READ_BUDGET for a model caching 4 KiB of K/V a token and layer (8
KV heads x 128 x 16 bits, the 0.6B's and the 8B's, where it was measured: a 256-token prompt
alone is 32,768 reads, ~1.3 ms of K/V on the 0.6B across its 28 layers, against ~15 ms of
launches saved), scaled down for models that cache more a token (`read_budget`).
FOLIO_PER_TOKEN_STEPS=0 keeps such steps eager (the A/B switch).
"""

from __future__ import annotations

import os

from folio.core.scheduler_output import SchedulerOutput

PER_TOKEN_READ_BUDGET = 32768
_MEASURED_KV_BYTES = 8 * 128 * 2 * 2  # K and V of 8 heads x 128 in 16 bits: one token, one layer
_SWITCH = os.environ.get("FOLIO_PER_TOKEN_STEPS", "1")
if _SWITCH not in ("0", "1"):
    raise ValueError(f"FOLIO_PER_TOKEN_STEPS={_SWITCH!r}: expected 1 (the default) or 0.")
ENABLED = _SWITCH == "1"


def read_budget(kv_bytes_per_token_layer: int) -> int:
    """The token reads a layer allowed for a model caching this many bytes a token and layer
    (on this rank): the measured budget, never more, fewer for larger K/V."""
    return PER_TOKEN_READ_BUDGET * _MEASURED_KV_BYTES // max(kv_bytes_per_token_layer, _MEASURED_KV_BYTES)


def takes_per_token_step(scheduler_output: SchedulerOutput, max_tokens: int,
                         budget: int = PER_TOKEN_READ_BUDGET) -> bool:
    """A step with some multi-token request (a prompt chunk) and at most max_tokens tokens (the
    largest decode graph), whose per-token attention would read at most `budget` tokens' K/V a
    layer beyond what decode tokens read anyway. Host ints only."""
    so = scheduler_output
    total = so.total_num_scheduled_tokens
    if not ENABLED or total > max_tokens or total == len(so.scheduled):
        return False
    extra = sum(s.num_new_tokens * (s.num_computed_tokens + s.num_new_tokens / 2)
                for s in so.scheduled if s.num_new_tokens > 1)
    return extra <= budget
