"""Waiting queues: FCFS with preempted requests at the front; priority by (priority, arrival)."""

from __future__ import annotations

import pytest

from folio.core.request_queue import FCFSRequestQueue, PriorityRequestQueue, make_request_queue
from tests.core.fakes import make_request


def ids(queue) -> list[str]:
    return [r.request_id for r in queue]


def test_fcfs_pops_in_arrival_order_and_puts_preempted_first():
    q = FCFSRequestQueue()
    a, b, c = (make_request(x) for x in "abc")
    q.add(a)
    q.add(b)
    q.prepend(c)
    assert ids(q) == ["c", "a", "b"] and q.peek() is c and len(q) == 3
    q.remove(a)
    assert [q.pop(), q.pop()] == [c, b]
    assert not q
    with pytest.raises(IndexError):
        q.pop()
    with pytest.raises(ValueError):
        q.remove(a)


def test_priority_orders_by_priority_then_arrival_then_insertion():
    q = PriorityRequestQueue()
    reqs = [
        make_request("low_early", priority=1, arrival_time=1.0),
        make_request("high_late", priority=0, arrival_time=2.0),
        make_request("high_early", priority=0, arrival_time=1.0),
        make_request("high_early_2", priority=0, arrival_time=1.0),  # exact tie: FIFO
    ]
    for r in reqs:
        q.add(r)
    expected = ["high_early", "high_early_2", "high_late", "low_early"]
    assert ids(q) == expected  # iteration does not consume
    assert q.peek().request_id == "high_early"
    assert [q.pop().request_id for _ in range(4)] == expected


def test_priority_remove_keeps_heap_order():
    q = make_request_queue("priority")
    reqs = [make_request(str(p), priority=p) for p in (5, 3, 8, 1, 4)]
    for r in reqs:
        q.add(r)
    q.remove(reqs[1])  # priority 3
    q.prepend(reqs[1])  # a preempted request goes back to its place by key
    q.remove(reqs[3])  # priority 1, the head
    assert [q.pop().request_id for _ in range(len(q))] == ["3", "4", "5", "8"]
    with pytest.raises(ValueError):
        q.remove(reqs[3])


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="policy"):
        make_request_queue("lifo")
