"""The pipes between ``mmte serve``'s API process and its workers: the request queue never blocks the event loop (items
larger than the pipe wait in order), a reader in another process gets every item whole and in order, answers reach
the event loop, and a worker's error becomes a one-line ``{"error"}`` answer."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import pickle
import time
from queue import Empty

import pytest

pytest.importorskip("litserve")

from mmte.serve.inputs import Upload
from mmte.serve.transport import PipeTransport, RequestQueue


def _drain(q: RequestQueue, n: int, out) -> None:
    got = []
    for _ in range(n):
        got.append(q.get(timeout=30))
    out.put([(i, len(body.data)) for i, body in got])


def test_request_queue_never_blocks_the_event_loop_and_keeps_the_order():
    q = RequestQueue()
    items = [(i, Upload(bytes([i % 251]) * (200_000 + i), f"{i}.wav")) for i in range(12)]  # 2.4 MB: far over a pipe's 64 KiB

    async def put_all() -> float:
        t0 = time.perf_counter()
        for it in items:
            q.put(it)
        took = time.perf_counter() - t0
        while q._pending:  # the event loop flushes the rest as the reader takes it
            await asyncio.sleep(0.01)
        return took

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    reader = ctx.Process(target=_drain, args=(q, len(items), out))
    reader.start()
    try:
        took = asyncio.run(asyncio.wait_for(put_all(), 60))
        got = out.get(timeout=60)
    finally:
        reader.join(timeout=30)
    assert took < 1.0, took  # put only buffered what the pipe could not take
    assert got == [(i, 200_000 + i) for i in range(len(items))]
    with pytest.raises(Empty):
        q.get_nowait()


def test_request_queue_outside_an_event_loop_writes_blocking():
    q = RequestQueue()
    q.put((0, "uid", 1.0, {"image": [[0.0]]}))
    assert q.get(timeout=5) == (0, "uid", 1.0, {"image": [[0.0]]})
    with pytest.raises(Empty):
        q.get(timeout=0.05)


def test_answers_reach_the_event_loop():
    t = PipeTransport(1)

    async def main():
        first = await t.areceive(0, timeout=0.05)  # nothing yet: None, as LitServe's reader expects
        for i in range(50):
            t.send((f"uid{i}", ({"i": i}, "OK", None, 0)), consumer_id=0)
        return first, [await t.areceive(0, timeout=5) for _ in range(50)]

    first, got = asyncio.run(main())
    assert first is None and [g[0] for g in got] == [f"uid{i}" for i in range(50)]
    t.close()


def test_worker_errors_are_one_line_json():
    from fastapi import HTTPException

    from mmte.serve.server import _worker_error

    timeout = _worker_error(HTTPException(504, "Request timed out"))
    assert timeout.status_code == 504 and json.loads(timeout.body) == {"error": "Request timed out"}
    crash = _worker_error(pickle.dumps(RuntimeError("boom")))
    assert crash.status_code == 500 and set(json.loads(crash.body)) == {"error"}


def test_upload_pickles_as_its_bytes():
    u = pickle.loads(pickle.dumps(Upload(b"RIFF1234", "a.wav")))
    assert u.read() == b"RIFF1234" and u.filename == "a.wav" and getattr(u, "file", None) is None
