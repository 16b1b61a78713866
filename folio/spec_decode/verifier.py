"""SpecVerifier: one step's drafts checked against the target's logits at every scored position.

A request with drafts d_1..d_k contributes k + 1 rows of logits. Row j is processed exactly as
the sampler would process the logits of that position without speculation: its SamplingRow
sees the outputs so far plus d_1..d_j (penalties, bad_words and logits processors read them,
min_tokens counts them), then allowed tokens, min_tokens and bad_words bans, logit bias, logits
processors and penalties, then temperature, min_p, top-k and top-p give the target distribution
p_j (greedy requests take the argmax of the edited logits). rejection.py turns p and the drafts
into the emitted tokens. (Requests with logits processors get no drafts, Request.can_speculate:
the stage is here so that the rows stay the sampler's whatever that policy.)

Randomness: every row draws one uniform and one Exponential(1) per token. A seeded request
draws its rows from its own generator, in row order, so its tokens depend only on its seed,
its logits and its drafts, never on the rest of the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from folio.core.outputs import TokenLogprobs
from folio.core.scheduler_output import ScheduledRequest
from folio.kernels.argmax import argmax_rows
from folio.sample.logprobs import gather_logprobs
from folio.sample.metadata import SamplingMetadata, SamplingRow
from folio.sample.sampler import make_request_generator
from folio.sample.transfer import to_device
from folio.sample.truncation import apply_min_p, apply_top_k_top_p
from folio.spec_decode.rejection import rejection_sample

GeneratorFor = Callable[[ScheduledRequest], "torch.Generator | None"]


@dataclass
class VerifiedTokens:
    """Per verified request (in the order given): its emitted tokens and their log-probs."""

    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None]


class SpecVerifier:
    def __init__(self, vocab_size: int, seed: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        # Noise for rows of unseeded requests (seeded ones use their own generators).
        self.generator = make_request_generator(seed + 1, device)

    def verify(
        self,
        logits: torch.Tensor,  # [rows, vocab] raw target logits, k_i + 1 rows per request
        scheduled: Sequence[ScheduledRequest],
        generator_for: GeneratorFor,
    ) -> VerifiedTokens:
        num_drafts = [len(s.spec_token_ids) for s in scheduled]
        rows = [row for sched in scheduled for row in _position_rows(sched, generator_for(sched))]
        metadata = SamplingMetadata.build(rows, self.vocab_size, self.device)
        edited = _edit_logits(logits, metadata)  # [rows, vocab] float32
        argmax = argmax_rows(edited)  # [rows]
        greedy = [s.request.sampling_params.sampling_type_greedy for s in scheduled]
        if all(greedy):
            token_lists = _longest_matching_prefixes(argmax.tolist(), scheduled)  # the step's one copy
            return VerifiedTokens(token_lists, self._logprobs(logits, scheduled, token_lists))
        probs = uniforms = noise = None
        if not all(greedy):
            probs = _target_probs(edited, metadata)  # [rows, vocab]
            uniforms, noise = self._draw(scheduled, num_drafts, greedy, generator_for)
        drafts = [t for s in scheduled for t in (*s.spec_token_ids, 0)]
        draft_ids = to_device(drafts, torch.int64, self.device).clamp_(0, self.vocab_size - 1)  # [rows]
        tokens, num_accepted = rejection_sample(
            probs,
            argmax,
            draft_ids,
            to_device(num_drafts, torch.int64, self.device),
            to_device(greedy, torch.bool, self.device),
            uniforms,
            noise,
            max_k=max(num_drafts, default=0),
        )
        token_lists = [row[: n + 1] for row, n in zip(tokens.tolist(), num_accepted.tolist())]
        return VerifiedTokens(token_lists, self._logprobs(logits, scheduled, token_lists))

    def _draw(
        self,
        scheduled: Sequence[ScheduledRequest],
        num_drafts: list[int],
        greedy: list[bool],
        generator_for: GeneratorFor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """uniforms [rows] and Exponential(1) noise [rows, vocab]; seeded requests' rows from
        their own generators (uniforms first, then noise, in a fixed amount per step)."""
        num_rows = sum(num_drafts) + len(num_drafts)
        uniforms = torch.empty(num_rows, device=self.device)
        noise = torch.empty(num_rows, self.vocab_size, device=self.device)
        uniforms.uniform_(generator=self.generator)
        noise.exponential_(generator=self.generator)
        start = 0
        for sched, k, is_greedy in zip(scheduled, num_drafts, greedy):
            generator = None if is_greedy else generator_for(sched)
            if generator is not None:
                uniforms[start : start + k + 1].uniform_(generator=generator)
                noise[start : start + k + 1].exponential_(generator=generator)
            start += k + 1
        return uniforms, noise

    def _logprobs(
        self, logits: torch.Tensor, scheduled: Sequence[ScheduledRequest], token_lists: list[list[int]]
    ) -> list[list[TokenLogprobs] | None]:
        """Raw log-probs of each emitted token at its row, with the top `logprobs` tokens."""
        out: list[list[TokenLogprobs] | None] = [None] * len(scheduled)
        wanted = [i for i, s in enumerate(scheduled) if s.request.sampling_params.logprobs is not None]
        if not wanted:
            return out
        starts = _row_starts(scheduled)
        rows = [starts[i] + j for i in wanted for j in range(len(token_lists[i]))]
        targets = [t for i in wanted for t in token_lists[i]]
        num = max(scheduled[i].request.sampling_params.logprobs or 0 for i in wanted)
        ids, values, ranks = gather_logprobs(
            logits[to_device(rows, torch.int64, self.device)], to_device(targets, torch.int64, self.device), num
        )
        ids_l, values_l, ranks_l = ids.tolist(), values.tolist(), ranks.tolist()
        flat = 0
        for i in wanted:
            k = (scheduled[i].request.sampling_params.logprobs or 0) + 1
            entries = []
            for _ in token_lists[i]:
                entries.append(TokenLogprobs(ids_l[flat][:k], values_l[flat][:k], ranks_l[flat]))
                flat += 1
            out[i] = entries
        return out


def _longest_matching_prefixes(argmax: list[int], scheduled: Sequence[ScheduledRequest]) -> list[list[int]]:
    """Greedy verification on the host (rejection.py's greedy rule without its launches): the
    drafts while they equal the target's argmax, then the argmax at the first mismatch (or
    at the bonus row when every draft matched)."""
    token_lists, start = [], 0
    for sched in scheduled:
        drafts = sched.spec_token_ids
        rows = argmax[start : start + len(drafts) + 1]
        accepted = 0
        while accepted < len(drafts) and rows[accepted] == drafts[accepted]:
            accepted += 1
        token_lists.append(rows[: accepted + 1])
        start += len(drafts) + 1
    return token_lists


def _position_rows(sched: ScheduledRequest, generator: torch.Generator | None) -> list[SamplingRow]:
    """One SamplingRow per scored position: the outputs so far plus the drafts before it."""
    request = sched.request
    drafts = list(sched.spec_token_ids)
    k = len(drafts)
    num_outputs = sched.end - k - request.num_prompt_tokens  # before the first scored position
    outputs = request.output_token_ids
    # Penalties, bad_words and logits processors read the output ids (sample/penalties.py,
    # constraints.py, logits_processors.py): row j must see the drafts before it, as the
    # sampler would have; for other requests the rows share the list.
    p = request.sampling_params
    reads_outputs = (
        p.repetition_penalty != 1.0
        or p.frequency_penalty != 0.0
        or p.presence_penalty != 0.0
        or bool(p.bad_words_token_ids)
        or bool(p.logits_processors)
    )
    return [
        SamplingRow(
            request.sampling_params,
            request.prompt_token_ids,
            outputs + drafts[:j] if j and reads_outputs else outputs,
            generator,
            num_outputs + j,
        )
        for j in range(k + 1)
    ]


def _row_starts(scheduled: Sequence[ScheduledRequest]) -> list[int]:
    starts, row = [], 0
    for sched in scheduled:
        starts.append(row)
        row += len(sched.spec_token_ids) + 1
    return starts


def _edit_logits(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """The sampler's token-level edits (allowed ids, min_tokens and bad_words bans, bias,
    logits processors, penalties: sample/sampler.py's order), on a copy."""
    if metadata.constraints is None and metadata.logits_processors is None and metadata.penalties is None:
        return logits.float()  # [rows, vocab] nothing edits: a copy only when logits are not float32
    edited = logits.to(torch.float32, copy=True)  # [rows, vocab]
    if metadata.constraints is not None:
        metadata.constraints.apply(edited)
    if metadata.logits_processors is not None:
        metadata.logits_processors.apply(edited)
    if metadata.penalties is not None:
        metadata.penalties.apply(edited)
    return edited


def _target_probs(edited: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """The sampler's distribution after temperature, min_p, top-k and top-p (sample/sampler.py)."""
    logits = edited.clone()  # [rows, vocab]
    if metadata.temperature is not None:
        logits.div_(metadata.temperature.unsqueeze(1))
    if metadata.min_p is not None:
        apply_min_p(logits, metadata.min_p)
    if metadata.top_k is not None or metadata.top_p is not None:
        apply_top_k_top_p(logits, metadata.top_k, metadata.top_p, metadata.max_top_k)
    return logits.softmax(dim=-1)
