"""A synthetic step at the scheduler's maxima, for memory profiling before the KV cache exists."""

from __future__ import annotations

from folio.config import EngineConfig
from folio.core.request import Request
from folio.core.scheduler_output import ScheduledRequest, SchedulerOutput
from folio.sampling_params import SamplingParams


def dummy_scheduler_output(config: EngineConfig) -> SchedulerOutput:
    """max_num_batched_tokens tokens over as many sequences as max_num_seqs allows.

    Every sequence samples with top-k and top-p, so the sampler's sort is in the peak too.
    """
    sched = config.scheduler
    block_size = config.cache.block_size
    num_seqs = max(1, min(sched.max_num_seqs, sched.max_num_batched_tokens))
    lengths = _split(sched.max_num_batched_tokens, num_seqs, sched.max_model_len)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=1)
    scheduled, next_block = [], 0
    for i, length in enumerate(lengths):
        request = Request(f"profile-{i}", [0] * length, params)
        num_blocks = -(-length // block_size)
        blocks = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        scheduled.append(ScheduledRequest(request, 0, length, blocks, samples=True))
    return SchedulerOutput(scheduled=scheduled, total_num_scheduled_tokens=sum(lengths))


def _split(total: int, parts: int, cap: int) -> list[int]:
    base, extra = divmod(total, parts)
    lengths = [min(cap, base + (1 if i < extra else 0)) for i in range(parts)]
    return [n for n in lengths if n > 0]
