"""Waiting queues: the order in which requests are admitted, first-come or by priority.

Both queues hold Request objects (compared by identity) and share one interface, so the
scheduler never asks which policy is in force except to pick a preemption victim.
"""

from __future__ import annotations

import abc
import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from folio.core.request import Request


def priority_key(request: Request) -> tuple[int, float]:
    """Lower runs first: the priority value, then the earlier arrival (as in vLLM)."""
    return (request.priority, request.arrival_time)


class RequestQueue(abc.ABC):
    @abc.abstractmethod
    def add(self, request: Request) -> None:
        """Queue a new request in its place by the policy."""

    @abc.abstractmethod
    def prepend(self, request: Request) -> None:
        """Put back a preempted request so that it runs again as soon as its policy allows."""

    @abc.abstractmethod
    def peek(self) -> Request:
        """The request that pop() would return; IndexError when empty."""

    @abc.abstractmethod
    def pop(self) -> Request:
        """Remove and return the next request to admit; IndexError when empty."""

    @abc.abstractmethod
    def remove(self, request: Request) -> None:
        """Take a request out wherever it is (abort); ValueError if it is not queued."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The queued requests in admission order (does not consume them)."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(RequestQueue):
    """First come, first served; a preempted request goes back to the front."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def prepend(self, request: Request) -> None:
        # Victims are preempted newest first, so prepending each keeps them in arrival order.
        self._queue.appendleft(request)

    def peek(self) -> Request:
        if not self._queue:
            raise IndexError("peek from an empty request queue")
        return self._queue[0]

    def pop(self) -> Request:
        if not self._queue:
            raise IndexError("pop from an empty request queue")
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)  # Request has identity equality (eq=False)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityRequestQueue(RequestQueue):
    """A heap on (priority, arrival_time, insertion counter); the counter breaks exact ties
    first-in-first-out and keeps Request objects from ever being compared."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (*priority_key(request), next(self._counter), request))

    def prepend(self, request: Request) -> None:
        # Priority order does not depend on having been preempted: its key places it.
        self.add(request)

    def peek(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty request queue")
        return self._heap[0][-1]

    def pop(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty request queue")
        return heapq.heappop(self._heap)[-1]

    def remove(self, request: Request) -> None:
        for i, entry in enumerate(self._heap):
            if entry[-1] is request:
                # Aborts are rare next to pops: an O(n) rebuild keeps the heap simple.
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return
        raise ValueError(f"{request!r} is not in the queue")

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap))


def make_request_queue(policy: str) -> RequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"Unknown scheduling policy {policy!r}; expected 'fcfs' or 'priority'.")
