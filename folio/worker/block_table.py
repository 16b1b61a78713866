"""BlockTable: a persistent host copy of every scheduled request's block ids, one row each.

Converting each request's block list to an array every step costs a few microseconds per
request (~1 ms per step at 256 requests). Here a request keeps its row while it runs and the row
is updated incrementally: a decode step usually finds it current after one comparison, and
every block_size steps appends one id. The step's table is then one numpy gather of rows.

What can change in a request's block list between steps, and how a row notices:
- blocks appended (new tokens): the list is longer than the row;
- its last block replaced (copy-on-write of a shared partial block): the last id differs;
- everything replaced (preemption, then re-admission): the runner calls `drop` for preempted
  and finished requests, so the row starts afresh. Rows not used in the current step are
  reclaimed if the table ever runs out (2 x max_num_seqs rows), so a missed drop cannot wedge it.
Contract: a request's ids other than its last known one change only when the scheduler reports
it preempted or finished. Within that, a row is never stale: an append is checked against the
last known id, and any other change of length or of the last id rewrites the whole row.
"""

from __future__ import annotations

import numpy as np


class BlockTable:
    def __init__(self, max_rows: int, max_blocks_per_seq: int) -> None:
        self.max_blocks_per_seq = max_blocks_per_seq
        self.table = np.zeros((max_rows, max_blocks_per_seq), dtype=np.int32)  # [rows, blocks]
        self.num_blocks = [0] * max_rows  # ids valid in each row
        self.last_ids = [-1] * max_rows  # each row's last valid id, as a Python int (fast compare)
        self.rows: dict[str, int] = {}  # request id -> row
        self.free_rows = list(range(max_rows - 1, -1, -1))
        self.step = 0  # advanced by begin_step(); rows remember the step that last used them
        self.used_at = [0] * max_rows

    def begin_step(self) -> None:
        self.step += 1

    def row_for(self, request_id: str, block_ids: list[int]) -> int:
        """The request's row, brought up to date with block_ids."""
        row = self.rows.get(request_id)
        if row is None:
            row = self._take_row(request_id)
        self.used_at[row] = self.step
        n, known = len(block_ids), self.num_blocks[row]
        if n == known and (n == 0 or self.last_ids[row] == block_ids[-1]):
            return row  # the common decode step: nothing changed
        if n > self.max_blocks_per_seq:
            raise ValueError(
                f"Request {request_id!r} holds {n} blocks, more than max_model_len allows "
                f"({self.max_blocks_per_seq})."
            )
        if n > known > 0 and self.table[row, known - 1] == block_ids[known - 1]:
            self.table[row, known:n] = block_ids[known:]  # appended blocks only
        else:
            self.table[row, :n] = block_ids
        self.num_blocks[row] = n
        self.last_ids[row] = block_ids[-1] if n else -1
        return row

    def drop(self, request_id: str) -> None:
        row = self.rows.pop(request_id, None)
        if row is not None:
            self.num_blocks[row] = 0
            self.free_rows.append(row)

    def gather(self, rows: np.ndarray, width: int, out: np.ndarray) -> np.ndarray:
        """out[:len(rows), :width] = the rows' first `width` block ids; returns that view.

        out must be a C-contiguous [>= len(rows) * width] buffer viewed flat, so the result is a
        contiguous [len(rows), width] array (one host-to-device copy)."""
        view = out[: len(rows) * width].reshape(len(rows), width)
        np.take(self.table[:, :width], rows, axis=0, out=view)
        return view

    def _take_row(self, request_id: str) -> int:
        if not self.free_rows:
            self._reclaim_stale_rows()
        if not self.free_rows:
            raise RuntimeError(
                f"BlockTable is full: more than {len(self.used_at)} requests in one step."
            )
        row = self.free_rows.pop()
        self.rows[request_id] = row
        self.num_blocks[row] = 0
        return row

    def _reclaim_stale_rows(self) -> None:
        """Free the rows no request has used this step. Dropped rows are the rule; this keeps a
        request the runner never heard finish (a bug elsewhere) from filling the table: should
        its request run again, its row is simply rebuilt."""
        for request_id, row in list(self.rows.items()):
            if self.used_at[row] != self.step:
                self.drop(request_id)
