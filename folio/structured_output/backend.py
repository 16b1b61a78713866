"""The grammar backend interface: compile a GrammarSpec once, then one state per request.

A backend checks a spec without the tokenizer (`check`, cheap: run when a request is added),
compiles it against the tokenizer (`compile`, may take tens of ms: run on a worker thread) and
makes a fresh `GrammarState` per sample from the compiled grammar. The state is all a request
carries: it fills the bitmask of tokens allowed next and advances with each accepted token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from folio.structured_output.spec import GrammarSpec


class GrammarState(Protocol):
    """One sample's position in its grammar (Request.grammar)."""

    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token; False (state unchanged) if the grammar forbids it."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into bitmask[row] (int32 words, bit i of word w = token
        32 * w + i allowed)."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens (rejected speculative tokens)."""

    def reset(self) -> None:
        """Back to the start of the grammar, as if no token had been accepted."""

    def is_terminated(self) -> bool:
        """Whether the grammar has ended (its stop token accepted): nothing may follow."""


def fill_bitmasks(states: list[GrammarState], bitmask: torch.Tensor, rows: list[int]) -> None:
    """Fill bitmask[rows[i]] from states[i] for every i: states of a class with a batched fill
    (a `fill_many(states, bitmask, rows)` static method: xgrammar's runs on several threads)
    use it, the others fill row by row."""
    groups: dict[type, list[int]] = {}
    for i, state in enumerate(states):
        groups.setdefault(type(state), []).append(i)
    for cls, members in groups.items():
        fill_many = getattr(cls, "fill_many", None)
        if fill_many is not None:
            fill_many([states[i] for i in members], bitmask, [rows[i] for i in members])
        else:
            for i in members:
                states[i].fill_bitmask(bitmask, rows[i])


class UnenforcedKeywordsError(ValueError):
    """A backend would take the JSON schema but leave some of its keywords unenforced (a looser
    constraint than asked for), so it refuses it. Here, not in the backend's module, so the
    manager can tell it apart without importing the backend."""


class CompiledGrammar(Protocol):
    def new_state(self) -> GrammarState: ...


class GrammarBackend(Protocol):
    name: str

    def check(self, spec: GrammarSpec) -> None:
        """Raise ValueError if the spec is not a valid constraint for this backend."""

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile against the tokenizer; runs on a worker thread."""


@dataclass
class GrammarTimer:
    """Host time spent on per-token grammar work (filling masks, accepting tokens), for the
    benchmark's "grammar ms per step". Shared by every state of one engine."""

    seconds: float = 0.0
    calls: int = 0

    def add_since(self, start: float) -> None:
        self.seconds += time.perf_counter() - start
        self.calls += 1
