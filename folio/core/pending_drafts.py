"""PendingDrafts: a request's draft tokens while their values are still on the device.

A draft model's k steps run on the GPU after the verify step has already brought its tokens to
the host. The scheduler only needs how many drafts a request has (the next step's token count
and K/V slots), and the runner writes them into the next step's input ids on the device, so
waiting for their values would only stop the host while the GPU drafts. A PendingDrafts knows
its count at once; its values are read (and kept) the first time anyone indexes or iterates it:
the verifier does, after the next step's forward, by which time they were copied long ago.

`source` is duck-typed (this package stays free of torch): `source.values(column)` returns the
column's token ids as a list, waiting for the copy if need be (spec_decode/draft_steps.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload


class PendingDrafts(Sequence[int]):
    __slots__ = ("source", "column", "count", "_values")

    def __init__(self, source: Any, column: int, count: int) -> None:
        self.source = source  # the proposal batch's drafts: [steps, requests] on the device
        self.column = column  # this request's column in it
        self.count = count  # the first `count` steps of the column are this request's drafts
        self._values: list[int] | None = None

    def prefix(self, n: int) -> PendingDrafts:
        """The first n drafts, still pending (the scheduler may cap them)."""
        return PendingDrafts(self.source, self.column, max(0, min(n, self.count)))

    def values(self) -> list[int]:
        if self._values is None:
            self._values = self.source.values(self.column)[: self.count]
        return self._values

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index):  # noqa: ANN001, ANN204
        return self.values()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.values())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        shown = self._values if self._values is not None else f"<{self.count} on the device>"
        return f"PendingDrafts({shown})"


def draft_prefix(drafts: Sequence[int], n: int) -> Sequence[int]:
    """The first n of a request's drafts without reading pending values."""
    if isinstance(drafts, PendingDrafts):
        return drafts.prefix(n)
    return tuple(drafts[:n])
