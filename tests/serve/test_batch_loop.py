"""The batching loop of ``mmte serve`` (mmte.serve.api.GreedyBatchLoop), on a scripted queue: what is queued is taken
together, a lone request is taken without waiting, and under load the loop lingers for requests arriving within its
gap, so the clients a batch answered form one next batch instead of several small ones. The gaps are made long here
(0.2 s) and the arrivals far inside or outside them, so a loaded machine does not change the outcome."""

from __future__ import annotations

import time
from queue import Queue
from threading import Thread
from types import SimpleNamespace

import pytest

pytest.importorskip("litserve")

from mmte.serve.api import GreedyBatchLoop


def _api(batch_timeout: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(batch_timeout=batch_timeout, max_batch_size=32, request_timeout=30.0)


def _item(i: int) -> tuple:
    return (0, f"uid{i}", time.monotonic(), {"i": i})


def _feed(q: Queue, n: int, spacing: float, first: float | None = None) -> Thread:
    def run() -> None:
        for i in range(n):
            time.sleep(first if i == 0 and first is not None else spacing)
            q.put(_item(i))

    t = Thread(target=run, daemon=True)
    t.start()
    return t


def _loop(last_size: int, busy: float) -> GreedyBatchLoop:
    """A loop whose previous batch held ``last_size`` requests and took ``busy`` seconds (gap: 5% of it, <= 0.2 s)."""
    loop = GreedyBatchLoop()
    loop.max_gap = 0.2
    loop._last_size, loop._last_taken = last_size, time.monotonic() - busy
    return loop


def test_queued_requests_are_taken_together():
    q: Queue = Queue()
    for i in range(5):
        q.put(_item(i))
    got, _ = GreedyBatchLoop().get_batch_requests(_api(), q, None)
    assert [p[1] for p in got] == [f"uid{i}" for i in range(5)]


def test_a_lone_request_does_not_wait_for_the_next():
    q: Queue = Queue()
    feeder = _feed(q, 2, 0.3)  # concurrency 1: the previous batch was one request
    got, _ = _loop(1, 4.0).get_batch_requests(_api(), q, None)
    assert len(got) == 1
    feeder.join()


def test_under_load_the_loop_lingers_for_requests_within_its_gap():
    q: Queue = Queue()
    q.put(_item(-1))  # queued while the previous batch ran
    feeder = _feed(q, 6, 0.005)  # the answered clients send again, far inside the 0.2 s gap
    got, _ = _loop(8, 4.0).get_batch_requests(_api(), q, None)
    feeder.join()
    assert len(got) == 7, [p[1] for p in got]


def test_the_batch_ends_at_a_pause_longer_than_the_gap():
    q: Queue = Queue()
    q.put(_item(-1))
    feeder = _feed(q, 2, 0.5)  # further apart than the 0.2 s gap
    got, _ = _loop(8, 4.0).get_batch_requests(_api(), q, None)
    assert len(got) == 1
    feeder.join()


def test_an_idle_server_does_not_linger_even_after_a_big_batch():
    q: Queue = Queue()
    # the first request comes 0.3 s after the worker asked (longer than the gap: not under load), the next ones close behind
    feeder = _feed(q, 3, 0.01, first=0.3)
    got, _ = _loop(32, 4.0).get_batch_requests(_api(), q, None)
    assert len(got) == 1
    feeder.join()
