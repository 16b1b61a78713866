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

Async scheduling: a step may be scheduled and executed before the previous step's update. Then a
request's last new token is a placeholder, and FakeModel takes its id from what it sampled in the
previous step (its "device" state), as the runner does; anything else about placeholders (one
per step, only ever the single new token, only from the step just before) fails at once.
`run_pipelined` drives a scheduler that way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from folio.config.scheduler import SchedulerConfig
from folio.core.outputs import ModelRunnerOutput
from folio.core.request import Request
from folio.core.scheduler import Scheduler
from folio.core.scheduler_output import ScheduledRequest, SchedulerOutput
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
    # What the previous execute sampled, by request id: the runner's sampled ids on the device.
    sampled: dict[str, int] = field(default_factory=dict)
    # Per step, request id -> its length (prompt + outputs) when the step ran; ScheduledRequest
    # reads the live request, so only this tells later which step reached the end and sampled.
    lengths: list[dict[str, int]] = field(default_factory=list)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.steps.append(out)
        self.lengths.append({s.request_id: s.request.num_tokens for s in out.scheduled})
        self._move_blocks(out)
        contents = [_contents(self._tokens(s)) for s in out.scheduled]
        for sched, content in zip(out.scheduled, contents):
            assert len(sched.block_ids) * self.block_size >= sched.end, "block table too short"
            for pos in range(sched.num_computed_tokens, sched.end):
                self.slots[self._slot(sched.block_ids, pos)] = content[pos]
        sampled: list[list[int]] = []
        for sched, content in zip(out.scheduled, contents):  # attention reads the whole context
            for pos in range(sched.end):
                assert self.slots.get(self._slot(sched.block_ids, pos)) == content[pos], (
                    f"{sched.request_id}: KV at position {pos} was lost or overwritten")
            sampled.append([self._sample(sched.request, sched.end, content)] if sched.samples else [])
        self.sampled = {s.request_id: t[0] for s, t in zip(out.scheduled, sampled) if t}
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

    def _tokens(self, sched: ScheduledRequest) -> list[int]:
        """The step's context: the known tokens, then the placeholder's id from the last step."""
        known = sched.request.all_token_ids
        if sched.end <= len(known):
            return known[: sched.end]
        assert sched.end == len(known) + 1 and sched.num_new_tokens == 1 and sched.samples, (
            f"{sched.request_id}: a placeholder that is not the step's only new token")
        assert sched.request_id in self.sampled, f"{sched.request_id}: placeholder of no last step"
        return known + [self.sampled[sched.request_id]]

    def _slot(self, table: list[int], pos: int) -> int:
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _sample(self, request: Request, end: int, content: list) -> int:
        scripted = self.script.get(request.request_id)
        index = end - request.num_prompt_tokens  # outputs before this one
        if scripted is not None and index < len(scripted):
            return scripted[index]
        if self.next_token is not None:
            return self.next_token(request, end)
        return default_next_token([token for _, token, _ in content])


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
    _update(scheduler, out, model.execute(out), result)
    return out


def _update(scheduler: Scheduler, out: SchedulerOutput, runner_out: ModelRunnerOutput, result: RunResult) -> None:
    for core_out in scheduler.update_from_output(out, runner_out):
        assert core_out.request_id not in result.finish_reasons, "output after the finish"
        result.outputs.setdefault(core_out.request_id, []).extend(core_out.new_token_ids)
        if core_out.finished:
            result.finish_reasons[core_out.request_id] = core_out.finish_reason
            result.stop_reasons[core_out.request_id] = core_out.stop_reason
    result.num_steps += 1


def run_to_completion(
    scheduler: Scheduler, model: FakeModel, max_steps: int = 2000, *, pipelined: bool = False
) -> RunResult:
    if pipelined:
        return run_pipelined(scheduler, model, max_steps)
    result = RunResult({}, {}, {}, 0)
    while scheduler.has_unfinished_requests():
        assert result.num_steps < max_steps, "the scheduler made no progress"
        step(scheduler, model, result)
    return result


def run_pipelined(scheduler: Scheduler, model: FakeModel, max_steps: int = 2000) -> RunResult:
    """As LLMEngine with async scheduling: step N+1 is scheduled and executed before step N's
    update, unless some request needs synchronous steps; nothing is left in flight at the end."""
    result = RunResult({}, {}, {}, 0)

    def launch() -> tuple[SchedulerOutput, ModelRunnerOutput]:
        out = scheduler.schedule()
        return out, model.execute(out)

    in_flight = None
    while scheduler.has_unfinished_requests():
        assert result.num_steps < max_steps, "the scheduler made no progress"
        current = in_flight or launch()
        in_flight = None if scheduler.requires_sync_steps else launch()
        _update(scheduler, *current, result)
    if in_flight is not None:
        _update(scheduler, *in_flight, result)
    return result
