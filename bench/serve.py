"""Serving benchmark: ``mmte serve`` against the plain eager fp32 model and onnxruntime behind the same server, and a load check.

For each model (``fsdd_speakers``: a WAV upload per request; ``quickstart``: an 8x8 digit as JSON), the
recipe is trained for a few steps (the bench measures serving, not accuracy), exported with ``mmte
export --format onnx``, and served three times on 127.0.0.1 by ``mmte serve`` with ``--runtime``
``inference`` (predict's inference copy, the default), ``eager`` (the plain fp32 model) and ``onnx``
(onnxruntime on the exported graph), each with the same ``--workers`` (inference worker processes; the
cores are split between them, and onnxruntime computes on as many threads as torch). Each server gets a warm-up, then at
each concurrency (1, 8, 32: keep-alive connections, each sending its next request when its answer is back) a bounded run: ``--requests`` requests or
``--cell-seconds`` seconds, whichever ends first. Reported: throughput (answers per second) and the
p50 / p99 latency of one request as the client sees it, and the server's CPU time a request (every
process of it, from ``/proc``: less sensitive than latency to other jobs on the machine). The floor: the
in-process latency of the inference copy (``model.inference()``) on one preprocessed item, in the bench's
process with no server running, measured before the servers and again right after the inference server's cells (the
median of both: the machine's speed drifts over minutes). Beside it, not part of it: the in-process preprocessing of one request
(``spec.decode``: for a WAV the read, resampling and log-mel), which the server does per request too.

The load check (the quickstart served in fp32, ``32-true``): ``--load-requests`` requests at concurrency 32 with 1%
malformed ones of six kinds mixed in; counted: good answers equal to ``mmte predict``'s (class, and
probability within 1e-5), bad ones answered 4xx with an ``{"error"}`` line, 5xx
(expected 0); the server's resident memory (every process of it, ``/proc/<pid>/status`` VmRSS) after
500 requests, after the warm-up (2,000 requests: the batch sizes a concurrency of 32 forms, each with its own
allocations and oneDNN primitives, keep appearing over the first few thousand requests), half-way and at the end;
growth after the warm-up, and above all in the second half, is what a leak would show. Then a second load with SIGTERM sent in its middle: requests sent before
the signal that were answered, lost, or 5xx; the exit status and the seconds to exit.

Usage::

    python bench/serve.py                          # both models, then the load check
    python bench/serve.py --models quickstart --requests 200 --load-requests 2000
    python bench/serve.py --update-doc             # + BENCHMARKS.md's serve section
    python bench/serve.py --models quickstart --runtimes inference --requests 200 --load-requests 0   # a quick look (~1 min)
    python bench/serve.py --workers 2 --load-requests 0 --update-doc   # two one-thread workers: its own section

Output: tables on stdout, JSON in ``bench/results/serve.json``; the run's wall time at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _doc
from mmte.serve.client import Job, cpu_seconds, multipart, rss_mb, run_load, wait_healthy

RUNTIMES = ("inference", "eager", "onnx")
CONCURRENCY = (1, 8, 32)
FAST = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
FP32 = ["--trainer.precision", "32-true"]
FP32_TOL = 1e-5


def _mmte(*args: str, log: Path) -> None:
    with open(log, "a") as fh:
        r = subprocess.run([sys.executable, "-m", "mmte", *args], check=False, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"mmte {args[0]} failed with status {r.returncode}; see {log}")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ models
def prepare(name: str, work: Path, fsdd: Path) -> dict:
    """Train ``name`` a few steps in ``work``, export it to ONNX; returns its recipe args, request jobs and predict rows."""
    root = work / name
    root.mkdir(parents=True, exist_ok=True)
    log = root / "mmte.log"
    if name == "quickstart":
        base = ["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.default_root_dir", str(root / "run"), *FAST]
        fit = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "1"]
    else:
        data = root / "wavs"
        data.mkdir(exist_ok=True)
        for d in range(10):
            for spk in ("george", "theo", "jackson"):
                for i in (0, 5, 6):
                    link = data / f"{d}_{spk}_{i}.wav"
                    if not link.exists():
                        link.symlink_to(fsdd / link.name)
        base = ["--config", str(ROOT / "recipes" / f"{name}.yaml"), "--trainer.default_root_dir", str(root / "run"), *FAST,
                "--data.init_args.data_dir", str(data)]
        fit = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    if not (root / "run" / "checkpoints" / "best.ckpt").exists() and not list((root / "run").rglob("*.ckpt")):
        _mmte("fit", *base, *fit, log=log)
    onnx, why = root / "model.onnx", None
    if not onnx.exists():
        try:
            _mmte("export", *base, "--ckpt_path", "best", "--format", "onnx", "--out", str(onnx), log=log)
        except SystemExit as e:  # a model mmte export cannot trace: its onnx column stays empty, with the reason
            lines = [ln.strip() for ln in log.read_text().splitlines() if ln.strip().startswith(("File \"", "if ", "raise"))]
            why = re.sub(r'File "[^"]*/(mmte/[^"]+)", line (\d+), in \w+', r"\1:\2:", " ".join(lines[-2:]))[:200] or str(e)
            print(f"# {name}: no ONNX graph ({why})", flush=True)
    return {"name": name, "base": base, "onnx": str(onnx) if onnx.exists() else None, "onnx_error": why, "jobs": _jobs(name, root, fsdd),
            "log": str(log), "root": root}


def _jobs(name: str, root: Path, fsdd: Path) -> list[Job]:
    """The requests of a run (cycled): digits as JSON, or FSDD WAVs of a speaker the model did not train on."""
    if name == "quickstart":
        from mmte.data.datasets import sklearn_arrays

        x, _, _ = sklearn_arrays("digits")
        return [Job(json.dumps({"image": x[i].tolist(), "id": f"digits[{i}]"}).encode(), tag=f"digits[{i}]") for i in range(256)]
    wavs = sorted(fsdd.glob("*_yweweler_[0-4].wav"))
    return [Job(*multipart("audio", w.name, w.read_bytes()), tag=w.name) for w in wavs]


def floor_probe(model: dict, reps: int) -> tuple[Callable[[], list[float]], float]:
    """The floor's measurement and the preprocessing time: a function returning ``reps`` timings (ms) of the inference copy
    on one preprocessed item, in this process (no server), and the median ms of the preprocessing of one request (decoded
    as the server decodes it). The bench calls the function before the servers and again right after the inference
    server's cells, and takes the median of both: the machine's speed drifts over minutes, and the floor is compared with
    the concurrency-1 latency measured between the two."""
    import torch

    from mmte.cli.serve import served_model
    from mmte.serve.api import _one_thread

    served = served_model([*model["base"], "--ckpt_path", "best"])
    job = model["jobs"][0]
    if model["name"] == "quickstart":
        payload = json.loads(job.body)
    else:
        payload = {"audio": _FileField(job)}
    samples, _, _ = served.spec.decode(payload)
    batch = served.spec.collate(samples)
    infer = served.module.inference_model
    ctx = served.step_context or contextlib.nullcontext

    def measure() -> list[float]:
        times = []
        with torch.inference_mode(), ctx():
            for _ in range(max(10, reps // 10)):
                infer(batch)
            for _ in range(reps):
                t0 = time.perf_counter()
                infer(batch)
                times.append((time.perf_counter() - t0) * 1e3)
        return times

    pre = []
    for _ in range(reps):
        one = json.loads(job.body) if model["name"] == "quickstart" else {"audio": _FileField(job)}
        t0 = time.perf_counter()
        with _one_thread():
            served.spec.decode(one)
        pre.append((time.perf_counter() - t0) * 1e3)
    return measure, statistics.median(pre[len(pre) // 10:])


class _FileField:
    """A multipart job's file, as the decoder reads an upload."""

    def __init__(self, job: Job):
        import io

        data = job.body.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n--", 1)[0]
        self.filename, self.file = job.tag, io.BytesIO(data)

    def read(self) -> bytes:
        return self.file.read()


# ------------------------------------------------------------------------------------ server
@contextlib.contextmanager
def server(model: dict, runtime: str, log: Path, *extra: str):
    port = _port()
    args = [*model["base"], "--ckpt_path", "best", "--port", str(port), "--runtime", runtime, *model.get("serve_args", []), *extra]
    if runtime == "onnx":
        args += ["--onnx", model["onnx"]]
    fh = open(log, "a")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "mmte", "serve", *args], stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_healthy(port, proc, timeout=600)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        fh.close()


def cell(port: int, jobs: list[Job], concurrency: int, requests: int, seconds: float, pid: int | None = None) -> dict:
    batch = [jobs[i % len(jobs)] for i in range(requests)]
    c0 = cpu_seconds(pid) if pid is not None else 0.0
    t0 = time.perf_counter()
    got = [a for a in run_load(port, batch, concurrency, time_limit=seconds) if a is not None]
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - c0 if pid is not None else 0.0
    ok = sorted(a.seconds * 1e3 for a in got if a.status == 200)
    q = (lambda p: ok[min(len(ok) - 1, int(p * len(ok)))]) if ok else (lambda p: float("nan"))
    return {"concurrency": concurrency, "answered": len(ok), "errors": len(got) - len(ok), "seconds": wall,
            "throughput": len(ok) / wall, "p50_ms": q(0.50), "p99_ms": q(0.99), "server_cpu_ms": cpu * 1e3 / max(1, len(got))}


def bench_model(model: dict, args: argparse.Namespace) -> dict:
    measure, pre = floor_probe(model, args.floor_reps)
    floors = measure()
    out = {"floor_ms": statistics.median(floors), "preprocess_ms": pre, "cells": {}, "onnx_error": model["onnx_error"]}
    print(f"# {model['name']}: in-process floor {out['floor_ms']:.2f} ms (preprocessing of one request, not in it: {pre:.2f} ms)", flush=True)
    for rt in args.runtimes:
        if rt == "onnx" and model["onnx"] is None:
            continue
        with server(model, rt, model["root"] / f"serve-{rt}.log") as (proc, port):
            cell(port, model["jobs"], 32, min(320, args.requests), args.cell_seconds)  # warm-up: the batch shapes load forms
            cell(port, model["jobs"], 1, 20, args.cell_seconds)
            for c in args.concurrency:
                r = cell(port, model["jobs"], c, args.requests, args.cell_seconds, proc.pid)
                out["cells"][f"{rt}/{c}"] = r
                print(f"  {rt:9s} c={c:2d}: {r['throughput']:7.1f} req/s  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms"
                      f"  server CPU {r['server_cpu_ms']:5.2f} ms/request  ({r['answered']} answered, {r['errors']} errors)", flush=True)
        if rt == "inference":
            after = measure()
            out["floor_ms"] = statistics.median(floors + after)
            print(f"# {model['name']}: in-process floor after the inference server {statistics.median(after):.2f} ms; "
                  f"both: {out['floor_ms']:.2f} ms", flush=True)
    return out


# ------------------------------------------------------------------------------------ load check
BAD = [
    (json.dumps({"image": [[1.0, 2.0]]}).encode(), "application/json"),
    (b"{not json", "application/json"),
    (b"--b\r\nbroken", "multipart/form-data; boundary=b"),
    (json.dumps({"imag": [[0.0] * 8] * 8}).encode(), "application/json"),
    (b"image=1", "text/plain"),
    (json.dumps({"image": [[0.0] * 8] * 8, "top_k": -2}).encode(), "application/json"),
]


def _mixed(jobs: list[Job], n: int) -> list[Job]:
    return [Job(*BAD[(i // 100) % len(BAD)], tag=None) if i % 100 == 50 else jobs[i % len(jobs)] for i in range(n)]


def load_check(model: dict, args: argparse.Namespace) -> dict:
    """The load check on the quickstart (see the module docstring)."""
    root = model["root"]
    expected = _expected(model)  # fp32: an answer equals predict's within 1e-5
    known = [j for j in model["jobs"] if j.tag in expected]
    res: dict = {}
    with server(model, "inference", root / "serve-load.log", *FP32) as (proc, port):
        tol = FP32_TOL
        warm = _mixed(known, 2000)
        run_load(port, warm[:500], 32, time_limit=120)
        res["rss_after_500_mb"] = rss_mb(proc.pid)
        run_load(port, warm[500:], 32, time_limit=240)  # warm-up
        res["rss_after_warmup_mb"] = rss_mb(proc.pid)
        jobs = _mixed(known, args.load_requests)
        half = len(jobs) // 2
        t0 = time.perf_counter()
        got = run_load(port, jobs[:half], 32, time_limit=args.load_seconds)
        res["rss_half_mb"] = rss_mb(proc.pid)
        got += run_load(port, jobs[half:], 32, time_limit=max(1.0, args.load_seconds - (time.perf_counter() - t0)))
        res["seconds"] = time.perf_counter() - t0
        res["rss_end_mb"] = rss_mb(proc.pid)
        good = [(j, a) for j, a in zip(jobs, got) if j.tag is not None]
        bad = [(j, a) for j, a in zip(jobs, got) if j.tag is None]
        res.update(requests=len(jobs), sent=sum(a is not None for a in got), tolerance=tol,
                   good=len(good), correct=sum(a is not None and a.status == 200 and _same(a.body, expected[j.tag], tol) for j, a in good),
                   bad=len(bad), bad_4xx_with_message=sum(a is not None and isinstance(a.status, int) and 400 <= a.status < 500
                                                          and isinstance(a.body, dict) and "expected" in a.body.get("error", "") for _, a in bad),
                   status_5xx=sum(a is not None and isinstance(a.status, int) and a.status >= 500 for a in got),
                   connection_errors=sum(a is not None and isinstance(a.status, str) for a in got))
        # SIGTERM in the middle of a second load
        jobs2 = _mixed(known, args.sigterm_requests)
        answers: list = []
        t = threading.Thread(target=lambda: answers.extend(run_load(port, jobs2, 32, time_limit=60)))
        t.start()
        time.sleep(args.sigterm_after)
        t_sig = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        res["exit_seconds"] = time.perf_counter() - t_sig
        res["exit_status"] = code
        t.join()
        before = [a for a in answers if a is not None and a.sent < t_sig]
        res.update(sigterm_sent_before=len(before), sigterm_answered_before=sum(isinstance(a.status, int) and a.status < 500 for a in before),
                   sigterm_lost_before=sum(isinstance(a.status, str) for a in before),
                   sigterm_5xx=sum(isinstance(a.status, int) and a.status >= 500 for a in answers if a is not None),
                   sigterm_refused_after=sum(isinstance(a.status, str) for a in answers if a is not None and a.sent >= t_sig))
    return res


def _expected(model: dict) -> dict:
    """``mmte predict``'s rows in fp32 (``32-true``), by id."""
    import csv

    root = model["root"]
    out = root / "predictions-fp32.csv"
    if not out.exists():
        _mmte("predict", *model["base"], *FP32, "--ckpt_path", "best", "--prediction_writer.output", str(out), "--prediction_writer.print_rows", "0",
              log=root / "mmte.log")
    with open(out) as fh:
        rows = {r["id"]: r for r in csv.DictReader(fh)}
    return rows


def _same(body: dict, row: dict | None, tol: float) -> bool:
    return row is not None and body.get("pred") == row["pred"] and abs(float(body.get("prob", -1)) - float(row["prob"])) <= tol


# ------------------------------------------------------------------------------------ report
def doc(results: dict) -> str:
    lines = []
    for name, r in results["models"].items():
        rows = []
        for c in results.get("concurrency", CONCURRENCY):
            cells = {rt: r["cells"].get(f"{rt}/{c}") for rt in RUNTIMES}
            inf = cells["inference"]
            vs = [f"{inf['throughput'] / cells[rt]['throughput']:.2f}x" if cells[rt] and inf else "n/a" for rt in ("eager", "onnx")]
            rows.append([c, *(f"{cells[rt]['throughput']:.1f}" if cells[rt] else "n/a" for rt in RUNTIMES), " / ".join(vs),
                         *(f"{cells[rt]['p50_ms']:.1f} / {cells[rt]['p99_ms']:.1f}" if cells[rt] else "n/a" for rt in RUNTIMES),
                         *(f"{cells[rt]['server_cpu_ms']:.2f}" if cells[rt] and "server_cpu_ms" in cells[rt] else "n/a" for rt in RUNTIMES)])
        pre = f"; preprocessing of one request, in process and not in the floor: {r['preprocess_ms']:.2f} ms" if "preprocess_ms" in r else ""
        workers = results.get("workers", 1)
        lines.append(f"**{name}** ({results['requests']} requests or {results['cell_seconds']:.0f} s a cell; every server with {workers} inference "
                     f"worker{'s' if workers != 1 else ''}; in-process floor, "
                     f"one item through the inference copy, measured before the servers and after the inference server: {r['floor_ms']:.2f} ms{pre})\n")
        if r.get("onnx_error"):
            lines.append(f"No onnxruntime column: `mmte export` cannot trace this model ({r['onnx_error']}).\n")
        one, many = r["cells"].get("inference/1"), r["cells"].get("inference/32")
        targets = [f"concurrency 1: p50 {one['p50_ms'] - r['floor_ms']:+.1f} ms over the floor (target <= 2)"] if one else []
        for rt, want in (("eager", 1.5), ("onnx", 1.0)):
            if many and f"{rt}/32" in r["cells"]:
                targets.append(f"concurrency 32: {many['throughput'] / r['cells'][f'{rt}/32']['throughput']:.2f}x {rt} (target >= {want})")
        if targets:
            lines.append("Against the targets: " + "; ".join(targets) + ".\n")
        lines.append(_doc.md_table(["concurrency", "req/s inference", "req/s eager fp32", "req/s onnxruntime", "inference vs eager / onnx",
                                    "p50 / p99 ms inference", "p50 / p99 ms eager", "p50 / p99 ms onnx",
                                    "server CPU ms/request inference", "eager", "onnx"], rows, ["r"] * 11))
        lines.append("")
    ld = results.get("load")
    if ld:
        lines.append(f"**Load check** (quickstart served in fp32, concurrency 32, {ld['requests']} requests, 1% malformed)\n")
        lines.append(_doc.md_table(["check", "result"], [
            ["good requests answered as mmte predict (class; probability within " + f"{ld['tolerance']:g})", f"{ld['correct']} / {ld['good']}"],
            ["malformed answered 4xx with an error line", f"{ld['bad_4xx_with_message']} / {ld['bad']}"],
            ["5xx / connection errors", f"{ld['status_5xx']} / {ld['connection_errors']}"],
            ["seconds (req/s)", f"{ld['seconds']:.1f} ({ld['sent'] / ld['seconds']:.0f})"],
            ["server RSS after 500 requests -> after the 2,000-request warm-up -> half-way -> end (all its processes)",
             (f"{ld.get('rss_after_500_mb', float('nan')):.0f} -> {ld['rss_after_warmup_mb']:.0f} -> {ld.get('rss_half_mb', float('nan')):.0f} -> "
              f"{ld['rss_end_mb']:.0f} MiB (after warm-up {ld['rss_end_mb'] - ld['rss_after_warmup_mb']:+.1f}, second half "
              f"{ld['rss_end_mb'] - ld.get('rss_half_mb', float('nan')):+.1f})")],
            ["SIGTERM mid-load: sent before it, answered / lost", (f"{ld['sigterm_sent_before']}: {ld['sigterm_answered_before']} / "
                                                                f"{ld['sigterm_lost_before']}")],
            ["SIGTERM: exit status, seconds to exit, 5xx, refused after", (f"{ld['exit_status']}, {ld['exit_seconds']:.1f} s, "
                                                                         f"{ld['sigterm_5xx']}, {ld['sigterm_refused_after']}")],
        ], ["l", "r"]))
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="fsdd_speakers,quickstart", help="comma-separated: fsdd_speakers (fsdd_audio without openwakeword), quickstart")
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"comma-separated subset of {','.join(RUNTIMES)}")
    p.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="comma-separated client concurrencies")
    p.add_argument("--requests", type=int, default=400, help="requests per cell (model x runtime x concurrency)")
    p.add_argument("--cell-seconds", type=float, default=20.0, help="time limit of a cell")
    p.add_argument("--floor-reps", type=int, default=200)
    p.add_argument("--workers", type=int, default=1, help="mmte serve --workers of every server (default 1; the cores are split between them)")
    p.add_argument("--load-requests", type=int, default=10000, help="requests of the load check (0: skip it)")
    p.add_argument("--load-seconds", type=float, default=600.0, help="time limit of the load check")
    p.add_argument("--sigterm-requests", type=int, default=2000)
    p.add_argument("--sigterm-after", type=float, default=1.0, help="seconds into the second load that SIGTERM is sent")
    p.add_argument("--fsdd", default=str(ROOT.parent / "shared" / "data" / "fsdd" / "recordings"))
    p.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    _doc.add_argument(p, "serve")
    args = p.parse_args(argv)
    args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if not args.runtimes or set(args.runtimes) - set(RUNTIMES):
        p.error(f"--runtimes takes a comma-separated subset of {RUNTIMES}; got {args.runtimes}")
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    started = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="mmte-bench-serve-"))
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    note = ""
    if "fsdd_speakers" in names:
        try:
            import openwakeword  # noqa: F401
        except ImportError:
            names = [("fsdd_audio" if n == "fsdd_speakers" else n) for n in names]
            note = "fsdd_audio instead of fsdd_speakers (openwakeword not installed)"
    results = {"requests": args.requests, "cell_seconds": args.cell_seconds, "concurrency": args.concurrency, "workers": args.workers, "models": {},
               "note": note}
    for name in names:
        model = prepare(name, work, Path(args.fsdd))
        model["serve_args"] = ["--workers", str(args.workers)] if args.workers != 1 else []
        results["models"][name] = bench_model(model, args)
        if name == "quickstart" and args.load_requests:
            results["load"] = load_check(model, args)
            print(json.dumps(results["load"], indent=1), flush=True)
    results["bench_seconds"] = time.perf_counter() - started
    print(doc(results))
    print(f"# bench/serve.py took {results['bench_seconds']:.0f} s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    section = "serve" if args.workers == 1 else f"serve-workers-{args.workers}"
    (out / f"{section}.json").write_text(json.dumps(results, indent=1, default=str))
    if args.update_doc:
        load = f"load average (uptime) {os.getloadavg()[0]:.2f} at the end, machine shared with other jobs"
        title = "Serving" if args.workers == 1 else f"Serving with {args.workers} inference workers"
        _doc.update_doc(section, doc(results), _doc.command_line("bench/serve.py", argv), args.update_doc,
                        machine=_doc.machine_line(note="; ".join(x for x in (note, load) if x)), title=title)
    return results


if __name__ == "__main__":
    main()
