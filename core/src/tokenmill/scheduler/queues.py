"""Waiting queues: first-come-first-served and priority order, behind one small interface."""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator

from tokenmill.request import Request


class RequestQueue(ABC):
    """Requests waiting for admission, in the order the scheduler should try them."""

    @abstractmethod
    def add(self, request: Request) -> None:
        """Queue a new request."""

    @abstractmethod
    def add_preempted(self, request: Request) -> None:
        """Queue a preempted request ahead of the requests that arrived after it."""

    @abstractmethod
    def peek(self) -> Request:
        """The next request to admit (IndexError when empty)."""

    @abstractmethod
    def pop(self) -> Request:
        """Remove and return ``peek()``."""

    @abstractmethod
    def remove_many(self, request_ids: set[str]) -> None:
        """Drop the requests with these ids (one pass over the queue)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The queued requests, in no guaranteed order."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSQueue(RequestQueue):
    """Arrival order; a preempted request goes back to the front."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def add_preempted(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove_many(self, request_ids: set[str]) -> None:
        self._queue = deque(r for r in self._queue if r.request_id not in request_ids)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue(RequestQueue):
    """Lowest ``priority`` value first, then earliest arrival, then insertion order."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._counter), request))

    def add_preempted(self, request: Request) -> None:
        self.add(request)  # its (priority, arrival) key already puts it ahead of later arrivals

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove_many(self, request_ids: set[str]) -> None:
        self._heap = [entry for entry in self._heap if entry[3].request_id not in request_ids]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in self._heap)


def create_request_queue(policy: str) -> RequestQueue:
    """The waiting queue for a scheduling policy ("fcfs" or "priority")."""
    if policy == "fcfs":
        return FCFSQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}: use 'fcfs' or 'priority'")
