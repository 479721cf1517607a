"""Pipeline bubble: measured idle fraction of each ``torch.distributed.pipelining`` schedule vs theory.

Each pipeline rank is a CPU process (gloo). The stages are synthetic and of *equal cost*: a stage's
forward sleeps ``t_F``, its input-gradient backward sleeps ``t_B`` and its weight-gradient backward
``t_W`` (three custom autograd functions; sleeping rather than spinning makes the costs exact and
independent of how many cores are free). With ``v`` stages per rank each stage costs ``1/v`` of a
rank's share, so every schedule does the same work per step.

A rank's bubble fraction is ``1 - busy / T`` with ``busy`` the sum of its stages' measured compute
(sleep) time and ``T`` the step's wall time; the table shows the mean over ranks and steps (after one
warm-up step). Each schedule is also run with zero-cost stages: that step time is its communication and
Python overhead, and the ``- overhead`` column is ``1 - busy / (T - T_overhead)``, the bubble the
schedule's dependency structure leaves. Theory (``F = B = W``, no communication cost):

* GPipe, 1F1B: ``(p-1)/(m+p-1)``
* Interleaved 1F1B (``v`` virtual stages): ``(p-1)/(v*m+p-1)``
* ZBV, DualPipeV: 0 in the ideal ``F = B = W`` case once there are enough microbatches (``m >= 2p``;
  zero-bubble papers); the measured values show what warm-up/cool-down and the schedule's dependencies
  really leave (with ``m = p`` ZBV keeps a sizeable bubble).
* The first stage has no input gradient; its ``B`` time is charged to its weight gradient so that
  every stage costs ``F + B + W`` per microbatch.

Differences from theory are gloo send/recv latency and Python scheduling overhead per action, which
grow with the number of actions (microbatches x stages). Multi-GPU runs are out of reach on this
machine (one GPU at most), so only CPU processes are measured — no GPU figures are estimated.

Usage::

    python bench/pipeline.py                          # p in {2, 4}, m in {4, 8}, 20 ms per stage-F
    python bench/pipeline.py --pp 2 --microbatches 8 16 --stage-ms 10
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _doc
from mmte.parallel.pipeline import bubble_fraction, build_schedule, stage_ids, stages_per_rank

SCHEDULES = ["gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev"]
_BUSY = [0.0]  # this process's measured compute seconds


def _sleep(s: float) -> None:
    t = time.perf_counter()
    time.sleep(s)
    _BUSY[0] += time.perf_counter() - t


class _Cost(torch.autograd.Function):
    """Identity whose forward sleeps ``tf`` and backward ``tb``."""

    @staticmethod
    def forward(ctx, x, tf, tb):
        ctx.tb = tb
        _sleep(tf)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _sleep(ctx.tb)
        return g, None, None


class SyntheticStage(nn.Module):
    """``out = cost_F/B(x) * cost_W(w)``: forward ``t_F``, input-grad ``t_B``, weight-grad ``t_W``."""

    def __init__(self, dim: int, tf: float, tb: float, tw: float):
        super().__init__()
        self.w = nn.Parameter(torch.ones(dim))
        self.tf, self.tb, self.tw = tf, tb, tw

    def forward(self, x):
        h = _Cost.apply(x, self.tf, self.tb)
        # the first stage's input needs no gradient, so autograd skips its B: charge that time to the
        # weight gradient instead, so that every stage costs F + B + W per microbatch
        tw = self.tw if x.requires_grad else self.tw + self.tb
        w = _Cost.apply(self.w, 0.0, tw)
        return h * w


def _loss(out, target):
    return (out - target).square().mean()


def _time_steps(sched, stages, mods, x, y, cost: float, steps: int) -> tuple[list[float], list[float]]:
    """Wall time (max over ranks) and this rank's compute time of ``steps`` steps after a warm-up step."""
    for _, mod in mods:
        mod.tf = mod.tb = mod.tw = cost
    walls, busys = [], []
    for step in range(steps + 1):
        dist.barrier()
        _BUSY[0] = 0.0
        start = time.perf_counter()
        kw = {"target": y, "losses": []} if any(s.is_last for s in stages) else {}
        if any(s.is_first for s in stages):
            sched.step(x, **kw)
        else:
            sched.step(**kw)
        wall = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # the step ends when the last rank finishes
        if step > 0:  # step 0 also infers the p2p shapes
            walls.append(wall.item())
            busys.append(_BUSY[0])
    return walls, busys


def _worker(rank: int, world: int, port: int, cfg: dict, q) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.group.WORLD
    rows = []
    t0 = cfg["stage_ms"] / 1000.0
    for m in cfg["microbatches"]:
        for name in cfg["schedules"]:
            v = stages_per_rank(name, cfg["virtual_stages"])
            num_stages = world * v
            if name == "dualpipev" and m < num_stages:
                rows.append({"schedule": name, "pp": world, "microbatches": m, "skipped": f"needs m >= {num_stages}"})
                continue
            if name == "interleaved_1f1b" and m % world:
                rows.append({"schedule": name, "pp": world, "microbatches": m, "skipped": f"needs m % {world} == 0"})
                continue
            ts = t0 / v  # a rank's share of the model is split over its v stages
            mods = [(i, SyntheticStage(cfg["dim"], ts, ts, ts)) for i in stage_ids(name, rank, world, cfg["virtual_stages"])]
            sched, stages = build_schedule(mods, num_stages, group, schedule=name, microbatches=m, loss_fn=_loss)
            x = torch.randn(m, cfg["dim"])
            y = torch.zeros(m, cfg["dim"])

            walls0, _ = _time_steps(sched, stages, mods, x, y, 0.0, cfg["steps"])  # schedule + communication overhead alone (zero-cost stages)
            walls, busys = _time_steps(sched, stages, mods, x, y, ts, cfg["steps"])
            t_over = sum(walls0) / len(walls0)
            frac = torch.tensor([sum(1 - b / w for b, w in zip(busys, walls)) / len(walls),
                                 sum(1 - b / max(w - t_over, b) for b, w in zip(busys, walls)) / len(walls)])
            dist.all_reduce(frac)
            frac /= world
            rows.append(
                {"schedule": name, "pp": world, "microbatches": m, "stages_per_rank": v, "measured": frac[0].item(),
                     "measured_minus_overhead": frac[1].item(), "theory": bubble_fraction(name, world, m, v),
                     "step_ms": 1000 * sum(walls) / len(walls), "overhead_ms": 1000 * t_over,
                     "ideal_busy_ms": 1000 * 3 * m * t0}
            )
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(pp: int, cfg: dict) -> list[dict]:
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(pp, _free_port(), cfg, q), nprocs=pp, join=True, start_method="spawn")
    return q.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--schedules", nargs="+", default=SCHEDULES)
    ap.add_argument("--stage-ms", type=float, default=20.0, help="forward time of a rank's share of the model (ms)")
    ap.add_argument("--virtual-stages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "pipeline.json"))
    _doc.add_argument(ap, "pipeline")
    a = ap.parse_args()
    cfg = {"microbatches": a.microbatches, "schedules": a.schedules, "stage_ms": a.stage_ms, "virtual_stages": a.virtual_stages,
               "steps": a.steps, "dim": a.dim}
    rows = []
    for p in a.pp:
        rows += run(p, cfg)
    print(f"pipeline bubble fraction, synthetic equal-cost stages (F=B=W={a.stage_ms:g} ms per rank share), CPU gloo, "
          f"mean of {a.steps} steps")
    print(f"{'schedule':<18}{'p':>3}{'m':>4}{'v':>3}{'step ms':>9}{'overhead ms':>12}{'measured':>10}{'- overhead':>11}{'theory':>8}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['schedule']:<18}{r['pp']:>3}{r['microbatches']:>4}{'':>3}{'skipped: ' + r['skipped']:>19}")
            continue
        print(
            f"{r['schedule']:<18}{r['pp']:>3}{r['microbatches']:>4}{r['stages_per_rank']:>3}{r['step_ms']:>9.0f}"
            f"{r['overhead_ms']:>12.0f}{r['measured']:>10.3f}{r['measured_minus_overhead']:>11.3f}{r['theory']:>8.3f}"
        )
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(a), "torch": torch.__version__, "rows": rows}, indent=2))
    print(f"wrote {out}")
    if a.update_doc:
        _doc.update_doc("pipeline", doc_table(rows, a.stage_ms, a.steps), _doc.command_line("bench/pipeline.py"), a.update_doc,
                        machine=_doc.machine_line(note="one process per rank, one torch thread each"))


def doc_table(rows: list[dict], stage_ms: float, steps: int) -> str:
    """The rows as BENCHMARKS.md's table: measured bubble, with the overhead of zero-cost stages taken out, against theory."""
    cells = []
    for r in rows:
        if "skipped" in r:
            cells.append([r["schedule"], r["pp"], r["microbatches"], "-", f"skipped: {r['skipped']}", "", "", ""])
        else:
            cells.append([r["schedule"], r["pp"], r["microbatches"], r["stages_per_rank"], f"{r['measured']:.3f}",
                          f"{r['measured_minus_overhead']:.3f}", f"{r['theory']:.3f}", f"{r['step_ms']:.0f}"])
    table = _doc.md_table(["schedule", "p", "m", "stages/rank", "measured", "measured - overhead", "theory", "step ms"], cells,
                          align="lrrrrrrr")
    return (table + f"\n\nOne CPU process (gloo) per pipeline rank; synthetic equal-cost stages that sleep ({stage_ms:g} ms forward "
            "per rank's share, the same for the input-gradient and weight-gradient backward), so the figures do not depend on free "
            f"cores. Bubble = 1 - busy / step time, mean over ranks and {steps} steps; \"- overhead\" subtracts the same schedule's "
            "step with zero-cost stages (communication + Python). Theory: (p-1)/(m+p-1) for GPipe/1F1B, (p-1)/(v*m+p-1) "
            "interleaved, 0 for the zero-bubble schedules (ZBV, DualPipeV), which need m >= 2p to approach it.")


if __name__ == "__main__":
    main()
