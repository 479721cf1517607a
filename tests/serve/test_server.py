"""``mmte serve`` as a process on a trained quickstart checkpoint, in fp32 (``32-true``): the same class and
probability as ``mmte predict`` on the same items (within 1e-5), concurrent requests batched with malformed ones
mixed in (each a 4xx with its line, never a 5xx; a slow run of 1,000 with the server's memory), and SIGTERM: the
requests in flight complete and the process exits 143 within 10 s."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import threading
import time

import pytest

from mmte.serve.client import Job, get, post, rss_mb, run_load

from .conftest import FP32, predict, serving

pytestmark = pytest.mark.slow  # each test talks to one `mmte serve` process (the server and its worker process)

pytest.importorskip("litserve")

#: fp32: a served probability against mmte predict's (predict batches 256 items, the server 1-16)
TOL = 1e-5


@pytest.fixture(scope="module")
def served(quick_run):
    """The quickstart run's fp32 predictions.csv, and ``mmte serve`` on its best.ckpt in fp32."""
    root, base = quick_run
    rows = predict([*base, *FP32], root / "predictions-fp32.csv")
    with serving([*base, *FP32], root / "serve.log", "--max_batch_size", "16") as (proc, port):
        yield proc, port, rows


def _digits():
    from mmte.data.datasets import sklearn_arrays

    x, _, _ = sklearn_arrays("digits")
    return x


def _item(rows, x, i):
    k = int(re.match(r"digits\[(\d+)\]", rows[i]["id"]).group(1))
    return json.dumps({"image": x[k].tolist(), "id": rows[i]["id"]}).encode()


def _bad_jobs() -> list[Job]:
    """Malformed requests of every kind the guard or the decoder refuses (each a 4xx with one line)."""
    return [
        Job(json.dumps({"image": [[1.0, 2.0]]}).encode(), tag="shape"),
        Job(b"{not json", tag="json"),
        Job(b"--b\r\nbroken", "multipart/form-data; boundary=b", tag="multipart"),
        Job(json.dumps({"imag": [[0.0] * 8] * 8}).encode(), tag="field"),
        Job(b"image=1", "text/plain", tag="content type"),
        Job(json.dumps({"image": [[0.0] * 8] * 8, "top_k": -2}).encode(), tag="top_k"),
    ]


def _check(jobs: list[Job], answers: list, rows) -> None:
    for job, a in zip(jobs, answers, strict=True):
        assert a is not None and isinstance(a.status, int) and a.status < 500, (job.tag, a)
        if job.tag is None or isinstance(job.tag, int):
            row = rows[job.tag]
            assert a.status == 200 and a.body["id"] == row["id"] and a.body["pred"] == row["pred"], (a.body, row)
            assert abs(a.body["prob"] - float(row["prob"])) <= TOL, (a.body, row)
        else:
            assert 400 <= a.status < 500 and set(a.body) == {"error"} and "expected" in a.body["error"] and "\n" not in a.body["error"], (job.tag, a)


def _load(rows, x, n: int, bad_every: int) -> list[Job]:
    bad = _bad_jobs()
    jobs = []
    for i in range(n):
        if i % bad_every == bad_every // 2:
            jobs.append(bad[(i // bad_every) % len(bad)])
        else:
            jobs.append(Job(_item(rows, x, i % len(rows)), tag=i % len(rows)))
    return jobs


def test_info_and_health(served):
    _, port, _ = served
    status, info = get(port, "/info")
    assert status == 200 and info["modalities"] == ["image"] and info["heads"]["digit"]["classes"] == [str(i) for i in range(10)]
    assert info["inputs"]["fields"]["image"]["shape"] == [8, 8] and info["checkpoint"].endswith("best.ckpt") and info["dtype"] == "fp32"


def test_answers_equal_mmte_predict_and_bad_requests_are_4xx_under_load(served):
    """Concurrent requests (batched by the server) with malformed ones mixed in: each good one gets predict's
    class and probability (fp32, within 1e-5), each bad one a 4xx with its one line, no 5xx."""
    _, port, rows = served
    x = _digits()
    jobs = _load(rows, x, 96, 8)
    _check(jobs, run_load(port, jobs, concurrency=8, time_limit=240), rows)


def test_probabilities_equal_mmte_predict_one_at_a_time(served):
    _, port, rows = served
    x = _digits()
    for i in range(8):
        status, body = post(port, _item(rows, x, i))
        assert status == 200 and body["pred"] == rows[i]["pred"] and abs(body["prob"] - float(rows[i]["prob"])) <= TOL, (body, rows[i])


def test_a_thousand_requests_at_concurrency_32(served):
    """1,000 requests from 32 connections, 1% malformed: every good one predict's answer, every bad one a 4xx
    with its line, no 5xx, and the server's memory (all its processes) grows < 50 MB after a warm-up."""
    proc, port, rows = served
    x = _digits()
    warm = _load(rows, x, 200, 100)
    _check(warm, run_load(port, warm, concurrency=32, time_limit=240), rows)
    before = rss_mb(proc.pid)
    jobs = _load(rows, x, 1000, 100)
    _check(jobs, run_load(port, jobs, concurrency=32, time_limit=480), rows)
    after = rss_mb(proc.pid)
    assert sum(j.tag is not None and not isinstance(j.tag, int) for j in jobs) == 10
    assert after - before < 50, (before, after)


def test_sigterm_finishes_the_requests_in_flight_and_exits_143(served):
    proc, port, rows = served
    x = _digits()
    done: list = []

    def one(i: int) -> None:
        try:
            done.append(post(port, _item(rows, x, i), timeout=20)[0])
        except (OSError, http.client.HTTPException) as e:  # refused or reset: the server had stopped accepting before this request
            done.append(type(e).__name__)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    took = time.monotonic() - t0
    for t in threads:
        t.join(timeout=30)
    assert code == 128 + signal.SIGTERM and took < 10, (code, took)
    assert 200 in done and all(d == 200 or isinstance(d, str) for d in done), done
    if os.name == "posix":
        with pytest.raises(OSError):
            post(port, _item(rows, x, 0), timeout=5)
