"""Fake requests and a fake model runner for testing core/ without torch.

FakeModel stands in for the runner and its paged KV cache (and the CPU swap pool). It applies
the step's block moves (swap-outs, copies, swap-ins, in the runner's order), writes each
scheduled token into the slot its block table names — every write of the step before any read,
as one forward pass does — then reads every earlier position back through the table. A slot
holds (position, token, digest of all tokens up to it), which is what real K/V depend on: a
slot holding a different prefix's token, a stale token, or a table too short fails the test at
once, while blocks legitimately shared (prefix cache, forks) pass. Sampled tokens are a
deterministic function of the tokens read, so a request computes the same outputs whatever else
is batched with it and however often it is preempted, recomputed, swapped or served from cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from folio.config.scheduler import SchedulerConfig
from folio.core.outputs import ModelRunnerOutput
from folio.core.request import Request
from folio.core.scheduler import Scheduler
from folio.core.scheduler_output import SchedulerOutput
from folio.sampling_params import SamplingParams

EOS = 2
FIRST_ORDINARY_TOKEN = 3  # default fake tokens never collide with EOS or small stop ids
VOCAB = 97


def make_request(
    request_id: str,
    num_prompt_tokens: int = 4,
    *,
    prompt: list[int] | None = None,
    max_tokens: int | None = 8,
    min_tokens: int = 0,
    stop_token_ids: list[int] | None = None,
    ignore_eos: bool = False,
    priority: int = 0,
    arrival_time: float = 0.0,
) -> Request:
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=stop_token_ids,
        ignore_eos=ignore_eos,
    )
    params.update_from_model({EOS})
    if prompt is None:
        prompt = [FIRST_ORDINARY_TOKEN + (i % 50) for i in range(num_prompt_tokens)]
    return Request(request_id, prompt, params, arrival_time=arrival_time, priority=priority)


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    enable_chunked_prefill: bool = True,
    policy: str = "fcfs",
    enable_prefix_caching: bool = False,
    num_cpu_blocks: int = 0,
    preemption_mode: str | None = None,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=enable_chunked_prefill,
        policy=policy,
        preemption_mode=preemption_mode,
    )
    return Scheduler(
        config,
        num_blocks,
        block_size,
        enable_prefix_caching=enable_prefix_caching,
        num_cpu_blocks=num_cpu_blocks,
    )


def default_next_token(tokens: list[int]) -> int:
    """A deterministic 'model': the next token depends on every token before it."""
    h = 0
    for t in tokens:
        h = (h * 31 + t) % 1_000_003
    return FIRST_ORDINARY_TOKEN + h % (VOCAB - FIRST_ORDINARY_TOKEN)


@dataclass
class FakeModel:
    block_size: int
    # Per request id, the tokens to sample in order (output index -> token); others use
    # next_token(request, end), by default default_next_token of the tokens before `end`.
    script: dict[str, list[int]] = field(default_factory=dict)
    next_token: Callable[[Request, int], int] | None = None
    # slot -> (position, token, digest of tokens[: position + 1]) last written there
    slots: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    cpu_slots: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # the swap pool
    steps: list[SchedulerOutput] = field(default_factory=list)
    # Per step, request id -> its length (prompt + outputs) when the step ran; ScheduledRequest
    # reads the live request, so only this tells later which step reached the end and sampled.
    lengths: list[dict[str, int]] = field(default_factory=list)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.steps.append(out)
        self.lengths.append({s.request_id: s.request.num_tokens for s in out.scheduled})
        self._move_blocks(out)
        contents = [_contents(s.request.all_token_ids[: s.end]) for s in out.scheduled]
        for sched, content in zip(out.scheduled, contents):
            assert len(sched.block_ids) * self.block_size >= sched.end, "block table too short"
            for pos in range(sched.num_computed_tokens, sched.end):
                self.slots[self._slot(sched.block_ids, pos)] = content[pos]
        sampled: list[list[int]] = []
        for sched, content in zip(out.scheduled, contents):  # attention reads the whole context
            for pos in range(sched.end):
                assert self.slots.get(self._slot(sched.block_ids, pos)) == content[pos], (
                    f"{sched.request_id}: KV at position {pos} was lost or overwritten")
            sampled.append([self._sample(sched.request, sched.end)] if sched.samples else [])
        return ModelRunnerOutput(req_ids=[s.request_id for s in out.scheduled],
                                 sampled_token_ids=sampled)

    def _move_blocks(self, out: SchedulerOutput) -> None:
        """Swap-outs, copies, swap-ins: each reads everything before it writes, like the runner."""
        self._copy(self.slots, self.cpu_slots, out.blocks_to_swap_out)
        self._copy(self.slots, self.slots, out.blocks_to_copy)
        self._copy(self.cpu_slots, self.slots, out.blocks_to_swap_in)

    def _copy(self, src_slots: dict, dst_slots: dict, pairs) -> None:
        bs = self.block_size
        read = [[src_slots.get(src * bs + i) for i in range(bs)] for src, _ in pairs]
        for (_, dst), values in zip(pairs, read):
            for i, value in enumerate(values):
                dst_slots[dst * bs + i] = value

    def _slot(self, table: list[int], pos: int) -> int:
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _sample(self, request: Request, end: int) -> int:
        scripted = self.script.get(request.request_id)
        if scripted is not None and request.num_output_tokens < len(scripted):
            return scripted[request.num_output_tokens]
        if self.next_token is not None:
            return self.next_token(request, end)
        return default_next_token(request.all_token_ids[:end])


def _contents(tokens: list[int]) -> list[tuple[int, int, int]]:
    """What the K/V at each position depend on: the position, its token, every earlier token."""
    out, h = [], 0
    for pos, t in enumerate(tokens):
        h = hash((h, t))
        out.append((pos, t, h))
    return out


@dataclass
class RunResult:
    outputs: dict[str, list[int]]  # request id -> every token it produced
    finish_reasons: dict[str, str]
    stop_reasons: dict[str, int | str | None]
    num_steps: int


def step(scheduler: Scheduler, model: FakeModel, result: RunResult) -> SchedulerOutput:
    out = scheduler.schedule()
    for core_out in scheduler.update_from_output(out, model.execute(out)):
        result.outputs.setdefault(core_out.request_id, []).extend(core_out.new_token_ids)
        if core_out.finished:
            result.finish_reasons[core_out.request_id] = core_out.finish_reason
            result.stop_reasons[core_out.request_id] = core_out.stop_reason
    result.num_steps += 1
    return out


def run_to_completion(scheduler: Scheduler, model: FakeModel, max_steps: int = 2000) -> RunResult:
    result = RunResult({}, {}, {}, 0)
    while scheduler.has_unfinished_requests():
        assert result.num_steps < max_steps, "the scheduler made no progress"
        step(scheduler, model, result)
    return result
