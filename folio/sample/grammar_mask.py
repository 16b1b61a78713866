"""GrammarMask: structured outputs' allowed tokens, a packed bitmask applied to the logits.

Each constrained row's grammar fills one row of an int32 bitmask on the host (bit i of word w
allows token 32 * w + i); the bitmask crosses to the device once per step and is unpacked and
applied there in one kernel: forbidden tokens get -inf. Rows without a grammar are not touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from folio.kernels.grammar_mask import apply_token_bitmask
from folio.sample.transfer import move, to_device
from folio.structured_output.backend import GrammarState, fill_bitmasks

if TYPE_CHECKING:
    from folio.sample.metadata import SamplingRow

BITS_PER_WORD = 32


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


@dataclass
class GrammarMask:
    rows: torch.Tensor  # [g] int64: batch rows with a grammar
    bitmask: torch.Tensor  # [g, words] int32, on the logits' device

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device) -> GrammarMask | None:
        """None when no row has a grammar; otherwise each grammar fills its row on the host."""
        batch_rows = [i for i, r in enumerate(rows) if r.grammar is not None]
        if not batch_rows:
            return None
        host = torch.zeros(len(batch_rows), bitmask_words(vocab_size), dtype=torch.int32)  # [g, words]
        live: list[GrammarState] = []
        live_rows: list[int] = []
        for local, i in enumerate(batch_rows):
            grammar = rows[i].grammar
            assert grammar is not None
            if grammar.is_terminated():
                # Async scheduling: the request ended at the previous step and this row's token
                # will be dropped; allow everything rather than leave a row of -inf.
                host[local] = -1
            else:
                live.append(grammar)
                live_rows.append(local)
        fill_bitmasks(live, host, live_rows)
        return cls(to_device(batch_rows, torch.int64, device), move(host, device))

    def apply(self, logits: torch.Tensor) -> None:
        """Edit logits [rows, vocab] float32 in place: -inf where the row's grammar forbids
        (one Triton kernel on CUDA, folio/kernels/grammar_mask.py; its torch reference else)."""
        apply_token_bitmask(logits, self.bitmask, self.rows)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[g, words] int32 -> [g, vocab_size] bool, True where the bit is set."""
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)  # [32]
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [g, words, 32]; & 1 undoes the sign fill
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
