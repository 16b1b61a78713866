"""Which small steps run their attention as one decode sequence per token, to replay a decode
CUDA graph instead of launching the forward kernel by kernel.

A step with prompt tokens runs eagerly: ~250 Python kernel launches for the 0.6B, ~15 ms of host
time where a short prompt's GPU work is ~3 ms (session 23, H100: time to first token of a
1,024-token prompt 18.4-19.3 ms against 3.09 ms of device time). StepInputBuilder's per-token
sequences (made for speculative verify steps) turn a step of T tokens into T one-token
sequences, each with its context up to itself: the same causal attention, decode-only, so the
decode graph of the bucket >= T replays it. The price is the attention's reads: a chunk of L new
tokens on C cached ones is read L * (C + L / 2) times over (once per token) instead of about once
per 64-row query block. `takes_per_token_step` allows it while that stays under
PER_TOKEN_READ_BUDGET token reads a layer (a 256-token prompt alone is 32,768: ~1.3 ms of K/V
reads on the 0.6B across its 28 layers, against ~15 ms of launches saved).
FOLIO_PER_TOKEN_STEPS=0 keeps such steps eager (the A/B switch).
"""

from __future__ import annotations

import os

from folio.core.scheduler_output import SchedulerOutput

PER_TOKEN_READ_BUDGET = 32768
_SWITCH = os.environ.get("FOLIO_PER_TOKEN_STEPS", "1")
if _SWITCH not in ("0", "1"):
    raise ValueError(f"FOLIO_PER_TOKEN_STEPS={_SWITCH!r}: expected 1 (the default) or 0.")
ENABLED = _SWITCH == "1"


def takes_per_token_step(scheduler_output: SchedulerOutput, max_tokens: int) -> bool:
    """A step with some multi-token request (a prompt chunk) and at most max_tokens tokens (the
    largest decode graph), whose per-token attention would read at most PER_TOKEN_READ_BUDGET
    tokens' K/V a layer beyond what decode tokens read anyway. Host ints only."""
    so = scheduler_output
    total = so.total_num_scheduled_tokens
    if not ENABLED or total > max_tokens or total == len(so.scheduled):
        return False
    extra = sum(s.num_new_tokens * (s.num_computed_tokens + s.num_new_tokens / 2)
                for s in so.scheduled if s.num_new_tokens > 1)
    return extra <= PER_TOKEN_READ_BUDGET
