"""``mmte serve`` as a process on a tiny FSDD audio model: real WAV files uploaded as multipart forms, sent
concurrently (so they are batched and padded), get the class and probability ``mmte predict`` writes for the
same files (fp32, within 1e-5)."""

from __future__ import annotations

import pytest

from mmte.serve.client import Job, get, multipart, run_load

from .conftest import predict, serving

pytestmark = pytest.mark.slow  # trains, then starts an `mmte serve` process (the server and its worker process)

pytest.importorskip("litserve")


def test_wav_uploads_equal_mmte_predict(fsdd_run):
    root, base, wavs = fsdd_run
    rows = {r["id"]: r for r in predict([*base, "--data.init_args.predict", str(wavs[0].parent)], root / "predictions-wav.csv")}
    assert set(rows) == {w.name for w in wavs}
    with serving(base, root / "serve-wav.log") as (_, port):
        status, info = get(port, "/info")
        assert status == 200 and info["inputs"]["kind"] == "files" and info["dtype"] == "fp32", info
        jobs = [Job(*multipart("audio", w.name, w.read_bytes()), tag=w.name) for w in wavs for _ in range(3)]
        answers = run_load(port, jobs, concurrency=len(wavs), time_limit=240)
    for job, a in zip(jobs, answers, strict=True):
        row = rows[job.tag]
        assert a is not None and a.status == 200 and a.body["id"] == job.tag, (job.tag, a)
        assert a.body["pred"] == row["pred"] and abs(a.body["prob"] - float(row["prob"])) <= 1e-5, (a.body, row)
