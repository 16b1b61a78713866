"""LogitsProcessors: vLLM's per-request callables, run on each row's logits on the host side
of the step.

A processor is `(output_token_ids, logits) -> logits` or `(prompt_token_ids, output_token_ids,
logits) -> logits` on one row's float32 logits [vocab] (SamplingParams checks which). They run
after the token constraints and before penalties, in list order, as vLLM's did. Requests that
have them step synchronously (Request.needs_sync_steps), so the output ids are complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from folio.param_checks import logits_processor_arity

if TYPE_CHECKING:
    from folio.sample.metadata import SamplingRow


@dataclass
class LogitsProcessors:
    # (batch row, prompt ids, output ids, the row's processors with their arity)
    rows: list[tuple[int, list[int], list[int], list[tuple[Callable[..., Any], int]]]]

    @classmethod
    def build(cls, rows: Sequence[SamplingRow]) -> LogitsProcessors | None:
        """None when no row has a processor: the sampler then skips this stage."""
        entries = [
            (i, r.prompt_token_ids, r.output_token_ids,
             [(proc, logits_processor_arity(proc)) for proc in r.params.logits_processors])
            for i, r in enumerate(rows)
            if r.params.logits_processors
        ]
        return cls(entries) if entries else None

    def apply(self, logits: torch.Tensor) -> None:
        """Edit logits [rows, vocab] float32 in place, row by row."""
        for row, prompt_ids, output_ids, procs in self.rows:
            row_logits = logits[row]  # [vocab]
            for proc, arity in procs:
                args = (prompt_ids, output_ids, row_logits) if arity == 3 else (output_ids, row_logits)
                result = proc(*args)
                if not isinstance(result, torch.Tensor) or result.shape != row_logits.shape:
                    raise ValueError(
                        f"logits processor {proc!r} must return a tensor of shape {tuple(row_logits.shape)}."
                    )
                row_logits = result.to(logits.dtype)
            logits[row] = row_logits
        self._check_samplable(logits)

    def _check_samplable(self, logits: torch.Tensor) -> None:
        """NaN, or every token at -inf, would sample token 0 as if it were chosen (a review found
        it): refused, with one device sync for all the processed rows."""
        rows = [row for row, *_ in self.rows]
        processed = logits[rows]  # [n, vocab]
        bad = torch.isnan(processed).any(1) | ~(processed > float("-inf")).any(1)  # [n]
        if bool(bad.any()):
            procs = self.rows[int(bad.nonzero()[0, 0])][3]
            raise ValueError(f"logits processors {[p for p, _ in procs]!r} left no token to sample "
                             "(NaN logits, or every token at -inf).")
