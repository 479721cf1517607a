"""Per-step time and peak memory per process of every ``configs/parallel`` fragment on a real recipe,
as ratios against one process, and the pipeline bubble measured on the real model beside its theory.

    python bench/strategies.py [--recipe quickstart] [--steps 12] [--warmup 4] [--fragments tp2,ddp,...]

Every run is the real ``mmte fit`` (the CLI class, in-process under ``torchrun``; fp32, one torch thread
per process, as the processes share the machine's cores). Step time: median over the steps after the
warm-up, of the wall time between ``on_train_batch_start`` and ``on_train_batch_end`` on rank 0. Peak
memory: the largest ``VmHWM`` growth of any rank over the measured steps (reset after warm-up).
The reference is one process with one thread and the whole batch; data-parallel fragments take
batch/dp per rank (the same global batch).

Pipeline bubble (``pp2-*``): with a perfect split, each of the ``p x dp`` ranks does ``1/(p dp)`` of
the single-process step's work, so ``bubble = 1 - T1 / (p dp Tpp)`` where ``T1`` is one process's step
and ``Tpp`` the pipelined step; this folds communication and any stage imbalance into the bubble. Theory for equal stage costs:
``(p-1)/(m+p-1)`` (1F1B), ~0 (zero-bubble V schedules, which also assume W = B and m >= 2p).

Prints a markdown table and writes JSON under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import _doc


def _hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def worker(out: str, args: list[str], warmup: int) -> None:
    import torch
    from lightning.pytorch import Callback

    from mmte.cli import MMTECLI

    torch.set_num_threads(1)

    class Timer(Callback):
        def __init__(self):
            self.times: list[float] = []
            self.t0 = 0.0
            self.base = 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == warmup:
                _reset_hwm()
                self.base = _hwm_kib()
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx >= warmup:
                self.times.append(time.perf_counter() - self.t0)

    timer = Timer()
    cli = MMTECLI(args=args, run=False, trainer_defaults={"callbacks": [timer]})
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    peak = (_hwm_kib() - timer.base) / 1024
    res = {"step_s": statistics.median(timer.times), "peak_mib": peak}
    if torch.distributed.is_initialized():
        parts = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(parts, res)
        res = {"step_s": parts[0]["step_s"], "peak_mib": max(p["peak_mib"] for p in parts)}
        if torch.distributed.get_rank() != 0:
            return
    Path(out).write_text(json.dumps(res))


def _free_port() -> int:
    """A port no one listens on now (a fixed one collides with other jobs' process groups on a shared machine)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(world: int, args: list[str], warmup: int, tmp: str, name: str) -> dict:
    out = os.path.join(tmp, f"{name}.json")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    me = [str(Path(__file__).resolve()), "--worker", out, "--warmup", str(warmup), "--", *args]
    cmd = [sys.executable, *me] if world == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
                                                     "--master_port", str(_free_port()), *me]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{p.stderr[-3000:]}")
    return json.loads(Path(out).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="quickstart")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--fragments", default=None, help="comma-separated fragment names (default: all of configs/parallel)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    _doc.add_argument(ap, "strategies")
    a, rest = ap.parse_known_args()
    if a.worker:
        worker(a.worker, rest[1:] if rest[:1] == ["--"] else rest, a.warmup)
        return

    import yaml

    from mmte.cli import env_report
    from mmte.parallel.pipeline import bubble_fraction
    from mmte.training.strategy import MMTEStrategy

    frags = {p.stem: p for p in sorted((REPO / "configs" / "parallel").glob("*.yaml"))}
    if a.fragments:
        frags = {k: frags[k] for k in a.fragments.split(",")}
    base = ["--config", str(REPO / "recipes" / f"{a.recipe}.yaml"), "--precision", "32-true", "--trainer.max_steps", str(a.steps + a.warmup),
            "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.enable_checkpointing", "false", "--checkpoint.save_last", "false"]
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        one = _run(1, [*base, "--data.init_args.batch_size", str(a.batch), "--trainer.default_root_dir", os.path.join(tmp, "one")],
                   a.warmup, tmp, "one")
        results["one"] = one
        for name, path in frags.items():
            cfg = yaml.safe_load(path.read_text())["trainer"]
            world = int(cfg["devices"])
            init = cfg["strategy"]["init_args"]
            dims = MMTEStrategy(**init).dims.resolve(world)
            r = _run(world, [*base, "--config", str(path), "--data.init_args.batch_size", str(a.batch // dims.dp),
                             "--trainer.default_root_dir", os.path.join(tmp, name)], a.warmup, tmp, name)
            results[name] = r
            bubble = theory = ""
            if dims.pp > 1:
                sched = init.get("pp_schedule", "1f1b")
                m = int(init.get("microbatches", 4))
                ideal = one["step_s"] / (dims.pp * dims.dp)  # each rank's share of one process's work
                bubble = f"{1 - ideal / r['step_s']:.3f}"
                theory = f"{bubble_fraction(sched, dims.pp, m):.3f}"
                r.update(bubble=float(bubble), theory=float(theory))
            rows.append((name, world, f"{r['step_s'] * 1e3:.1f}", f"{one['step_s'] / r['step_s']:.2f}x", f"{r['peak_mib']:.0f}",
                         f"{r['peak_mib'] / max(one['peak_mib'], 1e-9):.2f}x", bubble, theory))
    flags = dict(env_report())
    print(f"recipe {a.recipe}, global batch {a.batch}, {a.steps} measured steps after {a.warmup}; CPU {flags.get('cpu')} "
          f"({flags.get('cpu flags')}), one torch thread per process")
    print(f"one process: {one['step_s'] * 1e3:.1f} ms/step, peak +{one['peak_mib']:.0f} MiB\n")
    print("| fragment | processes | ms/step | speed vs one process | peak MiB/process | memory vs one | bubble (measured) | bubble (theory) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    out = REPO / "bench" / "results" / "strategies.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    if a.update_doc:
        note = f"one torch thread per process; reference: one process, {one['step_s'] * 1e3:.1f} ms/step, peak +{one['peak_mib']:.0f} MiB"
        _doc.update_doc("strategies", doc_table(rows, one, a), _doc.command_line("bench/strategies.py"), a.update_doc,
                        machine=_doc.machine_line(note=note))


def doc_table(rows: list[tuple], one: dict, a: argparse.Namespace) -> str:
    """The rows as BENCHMARKS.md's table; the memory ratio only where the reference grew by at least 1 MiB."""
    headers = ["fragment", "processes", "ms/step", "speed vs one process", "peak MiB/process", "memory vs one", "bubble (measured)",
               "bubble (theory)"]
    cells = [[*row[:5], row[5] if one["peak_mib"] >= 1 else "-", *row[6:]] for row in rows]
    table = _doc.md_table(headers, cells, align="lrrrrrrr")
    return (table + f"\n\nThe real `mmte fit` of `recipes/{a.recipe}.yaml` per `configs/parallel` fragment, fp32, global batch {a.batch}, "
            f"median step time over {a.steps} steps after {a.warmup} warm-up steps. Fragments with more processes than the machine "
            "has cores show that the layout runs, not its speed. Peak memory: the largest growth of any rank's VmHWM over the measured "
            "steps. The measured bubble folds gloo transfers and stage imbalance into the bubble: "
            "1 - T1 / (p dp Tpp) against one process's step T1.")


if __name__ == "__main__":
    main()
