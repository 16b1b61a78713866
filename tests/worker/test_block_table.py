"""BlockTable keeps each request's row equal to its block list through appends, copy-on-write
of the last block, preemption and row reuse."""

from __future__ import annotations

import numpy as np
import pytest

from folio.worker.block_table import BlockTable


def _row(table: BlockTable, request_id: str, n: int) -> list[int]:
    return table.table[table.rows[request_id], :n].tolist()


def test_rows_follow_appends_copy_on_write_and_reallocation():
    table = BlockTable(max_rows=4, max_blocks_per_seq=8)
    blocks = [7, 3]
    table.row_for("a", blocks)
    blocks += [5]  # one block appended
    table.row_for("a", blocks)
    assert _row(table, "a", 3) == [7, 3, 5]
    blocks[-1] = 9  # copy-on-write replaced the shared last block
    table.row_for("a", blocks)
    assert _row(table, "a", 3) == [7, 3, 9]
    blocks[:] = [1, 2, 8, 4]  # everything changed, longer: rewritten, not appended
    table.row_for("a", blocks)
    assert _row(table, "a", 4) == [1, 2, 8, 4]
    table.row_for("a", [6])  # shorter
    assert _row(table, "a", 1) == [6]


def test_dropped_rows_are_reused_and_start_empty():
    table = BlockTable(max_rows=2, max_blocks_per_seq=4)
    table.begin_step()
    row_a = table.row_for("a", [1, 2, 3])
    table.row_for("b", [4])
    with pytest.raises(RuntimeError, match="full"):
        table.row_for("c", [5])  # both rows are in use this step
    table.drop("a")
    table.drop("a")  # dropping twice is harmless
    assert table.row_for("c", [5, 6]) == row_a
    assert _row(table, "c", 2) == [5, 6]
    with pytest.raises(ValueError, match="max_model_len"):
        table.row_for("b", [1, 2, 3, 4, 5])


def test_gather_is_a_contiguous_prefix_in_batch_order():
    table = BlockTable(max_rows=3, max_blocks_per_seq=5)
    rows = [table.row_for(r, ids) for r, ids in (("x", [1, 2, 3]), ("y", [4]), ("z", [5, 6]))]
    out = np.full(15, -1, dtype=np.int32)
    got = table.gather(np.array([rows[2], rows[0]]), 3, out)
    assert got.flags.c_contiguous and got.shape == (2, 3)
    assert got[0, :2].tolist() == [5, 6] and got[1].tolist() == [1, 2, 3]


def test_rows_of_requests_never_dropped_are_reclaimed_when_full():
    table = BlockTable(max_rows=2, max_blocks_per_seq=4)
    table.begin_step()
    table.row_for("a", [1])
    table.row_for("b", [2])
    table.begin_step()  # "a" and "b" vanished without a drop
    table.row_for("c", [3, 4])
    table.row_for("a", [5])  # a stale id comes back: its row is rebuilt, not reused stale
    assert _row(table, "c", 2) == [3, 4] and _row(table, "a", 1) == [5]
    assert "b" not in table.rows
