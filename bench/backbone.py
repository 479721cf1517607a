"""Backbone speed and memory: mmte (fp32 eager / fused, bf16 path) vs timm (eager, compiled, bf16 autocast).

All variants run the same weights (the mmte encoder is converted from the timm model) on the same input,
in one process, interleaved round by round so background load hits them alike; the reported time is
the median over rounds. Peak memory is measured per variant in a fresh subprocess (CPU: peak RSS
growth during one warm step over the RSS before it; CUDA: ``max_memory_allocated``).

The machine's matmul rate is measured in the same run with ``F.linear`` at the layer's four GEMM
shapes (QKV, projection, fc1, fc2), same dtype; achieved GFLOP/s counts the GEMMs, the attention
matmuls and the patch embedding (a training step counts 3x the forward).

Variants: ``timm_eager``, ``timm_compile`` (fp32), ``timm_bf16_autocast`` (timm under
``torch.autocast(bfloat16)``), ``mmte_eager``, ``mmte_fused`` (fp32) and ``mmte_bf16`` (mmte under the same
autocast, which switches its backbone to the bf16 path of :mod:`mmte.te.lowp`: what ``precision:
bf16-mixed`` / ``auto`` runs). The bf16 variants run only with ``--dtype fp32`` (their parameters stay
fp32 master weights). Each table row gives the ratio to timm eager and to timm under bf16 autocast.

Usage::

    python bench/backbone.py --configs vit-s16 --rounds 5   # CPU: the bf16 path vs timm
    python bench/backbone.py                       # CPU, fp32: ViT-B/16 shapes + small
    python bench/backbone.py --device cuda --dtype bf16 --depth 12
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _doc
from mmte import device as mdev
from mmte.encoders import from_timm

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
VARIANTS = ("timm_eager", "timm_compile", "timm_bf16_autocast", "mmte_eager", "mmte_fused", "mmte_bf16")
AUTOCAST = ("timm_bf16_autocast", "mmte_bf16")


@dataclass
class Shape:
    name: str
    depth: int
    dim: int
    heads: int
    img: int = 224
    patch: int = 16

    @property
    def tokens(self) -> int:
        return (self.img // self.patch) ** 2 + 1


SHAPES = {
    "vit-b16": Shape("vit-b16", 12, 768, 12),
    "vit-s16": Shape("vit-s16", 12, 384, 6),
    "small": Shape("small", 4, 384, 6),
}


def forward_flops(s: Shape, batch: int) -> float:
    m, d, f, n = batch * s.tokens, s.dim, 4 * s.dim, s.tokens
    per_layer = 2 * m * d * (3 * d + d + 2 * f) + 4 * batch * n * n * d
    patch = 2 * batch * (n - 1) * 3 * s.patch * s.patch * d
    return s.depth * per_layer + patch


def matmul_rate(s: Shape, batch: int, dtype, dev, reps: int) -> float:
    """GFLOP/s of F.linear at this layer's GEMM shapes (the machine's ceiling for these shapes)."""
    m, d = batch * s.tokens, s.dim
    shapes = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]
    total_flops, total_time = 0.0, 0.0
    for k, n in shapes:
        a = torch.randn(m, k, device=dev, dtype=dtype)
        w = torch.randn(n, k, device=dev, dtype=dtype)
        b = torch.randn(n, device=dev, dtype=dtype)
        F.linear(a, w, b)
        times = []
        for _ in range(reps):
            mdev.synchronize(dev)
            t = time.perf_counter()
            F.linear(a, w, b)
            mdev.synchronize(dev)
            times.append(time.perf_counter() - t)
        total_flops += 2 * m * k * n
        total_time += statistics.median(times)
    return total_flops / total_time / 1e9


def build(variant: str, s: Shape, dtype, dev):
    import timm

    torch.manual_seed(0)
    src = timm.create_model(
        "vit_base_patch16_224", pretrained=False, num_classes=0, depth=s.depth, embed_dim=s.dim, num_heads=s.heads,
        img_size=s.img, patch_size=s.patch,
    )
    if variant.startswith("timm"):
        model = src
    else:
        model = from_timm(src, fused=variant == "mmte_fused")
    model = model.to(device=dev, dtype=dtype)
    if variant == "timm_compile":
        model.compile()
    return model


def make_step(model, x, train: bool, autocast: bool = False):
    ctx = (lambda: torch.autocast(x.device.type, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    if not train:
        model.eval()

        def fwd():
            with torch.inference_mode(), ctx():
                return model.forward_features(x)

        return fwd
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with ctx():
            out = model.forward_features(x)
        out.float().pow(2).mean().backward()
        opt.step()

    return step


def time_variants(s: Shape, args, dtype, dev) -> dict:
    x = torch.randn(args.batch, 3, s.img, s.img, device=dev, dtype=dtype)
    results = {}
    for train in (False, True):
        mode = "train" if train else "forward"
        steps = {}
        for v in args.variants:
            model = build(v, s, dtype, dev)
            fn = make_step(model, x, train, v in AUTOCAST)
            t0 = time.perf_counter()
            for _ in range(args.warmup):
                fn()
            mdev.synchronize(dev)
            steps[v] = (fn, time.perf_counter() - t0)
        times = {v: [] for v in args.variants}
        for _ in range(args.rounds):  # interleaved rounds
            for v in args.variants:
                fn = steps[v][0]
                mdev.synchronize(dev)
                t = time.perf_counter()
                fn()
                mdev.synchronize(dev)
                times[v].append(time.perf_counter() - t)
        for v in args.variants:
            results[(mode, v)] = {"median_s": statistics.median(times[v]), "min_s": min(times[v]), "warmup_s": steps[v][1]}
        del steps
    return results


def peak_memory_child(variant: str, shape: str, depth: int, batch: int, dtype: str, dev: str, train: bool) -> None:
    """Run in a subprocess: print the peak memory growth of one warm step (bytes)."""
    s = SHAPES[shape]
    s = Shape(s.name, depth or s.depth, s.dim, s.heads, s.img, s.patch)
    d = torch.device(dev)
    model = build(variant, s, DTYPES[dtype], d)
    x = torch.randn(batch, 3, s.img, s.img, device=d, dtype=DTYPES[dtype])
    fn = make_step(model, x, train, variant in AUTOCAST)
    fn()  # compile / allocate once
    if d.type == "cpu":
        # VmHWM is the peak RSS of this process image (ru_maxrss would include the parent's, inherited
        # across exec); writing 5 to clear_refs resets it to the current RSS, so the next step's peak
        # is measured on its own.
        base = _proc_status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        fn()
        peak = _proc_status("VmHWM")
        print(json.dumps({"peak_growth_bytes": peak - base, "peak_rss_bytes": peak}))
    else:
        mdev.synchronize(d)
        mdev.reset_peak_memory_stats(d)
        before = mdev.memory_allocated(d)
        fn()
        mdev.synchronize(d)
        print(json.dumps({"peak_growth_bytes": mdev.max_memory_allocated(d) - before, "peak_rss_bytes": mdev.max_memory_allocated(d)}))


def _proc_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory(variant, s: Shape, args, train: bool) -> int | None:
    cmd = [sys.executable, __file__, "--_child", variant, "--configs", s.name, "--depth", str(s.depth), "--batch", str(args.batch),
           "--dtype", args.dtype, "--device", args.device] + (["--_train"] if train else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True).stdout.strip().splitlines()[-1]
        return json.loads(out)["peak_growth_bytes"]
    except Exception as e:  # noqa: BLE001 - a child's failure of any kind is reported, not invented around
        print(f"  memory measurement failed for {variant}: {e}", file=sys.stderr)
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: fp32 on CPU, bf16 on GPUs")
    p.add_argument("--configs", default="vit-b16,small")
    p.add_argument("--depth", type=int, default=0, help="override the layer count (0: the shape's own)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of %(default)s")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", default="bench/results/backbone.json")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_train", action="store_true", help=argparse.SUPPRESS)
    _doc.add_argument(p, "backbone")
    args = p.parse_args()
    args.dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if args.dtype != "fp32":  # autocast variants need fp32 master weights
        args.variants = [v for v in args.variants if v not in AUTOCAST]
    if "timm_eager" not in args.variants:
        args.variants.insert(0, "timm_eager")
    if args._child:
        peak_memory_child(args._child, args.configs, args.depth, args.batch, args.dtype, args.device, args._train)
        return
    dev = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    where = mdev.describe() if dev.type == "cpu" else f"device={mdev.info(dev).name}"
    print(f"{where}; {args.device}, dtype={args.dtype}, torch threads={torch.get_num_threads()}, batch={args.batch}")
    report = []
    for name in args.configs.split(","):
        base = SHAPES[name]
        s = Shape(base.name, args.depth or base.depth, base.dim, base.heads, base.img, base.patch)
        rate = matmul_rate(s, args.batch, dtype, dev, reps=5)
        flops = forward_flops(s, args.batch)
        res = time_variants(s, args, dtype, dev)
        print(f"\n## {s.name}: {s.depth} layers x {s.dim}, {s.heads} heads, batch {args.batch} x {s.tokens} tokens; "
              f"matmul rate at the layer's GEMM shapes: {rate:.1f} GFLOP/s")
        print("| mode | variant | ms/step | samples/s | GFLOP/s | % of matmul rate | vs timm eager | vs timm compile | "
              "vs timm bf16 autocast | step peak MiB |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        nan = {"median_s": float("nan")}
        for mode, mult in (("forward", 1), ("train", 3)):
            te_ = res[(mode, "timm_eager")]["median_s"]
            tc_ = res.get((mode, "timm_compile"), nan)["median_s"]
            ta_ = res.get((mode, "timm_bf16_autocast"), nan)["median_s"]
            for v in args.variants:
                t = res[(mode, v)]["median_s"]
                gflops = mult * flops / t / 1e9
                mem = None if args.no_memory else peak_memory(v, s, args, mode == "train")
                row = {"shape": s.name, "depth": s.depth, "dim": s.dim, "batch": args.batch, "tokens": s.tokens, "mode": mode, "variant": v,
                           "ms": t * 1e3, "samples_per_s": args.batch / t, "gflops": gflops, "matmul_gflops": rate,
                           "pct_matmul": 100 * gflops / rate, "vs_timm_eager": te_ / t, "vs_timm_compile": tc_ / t, "vs_timm_bf16_autocast": ta_ / t,
                           "peak_bytes": mem, "device": args.device, "dtype": args.dtype}
                report.append(row)
                print(f"| {mode} | {v} | {t * 1e3:.1f} | {args.batch / t:.2f} | {gflops:.1f} | {row['pct_matmul']:.1f}% | "
                      f"{row['vs_timm_eager']:.3f}x | {row['vs_timm_compile']:.3f}x | {row['vs_timm_bf16_autocast']:.3f}x | "
                      f"{'n/a' if mem is None else f'{mem / 2**20:.0f}'} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.json}")
    if args.update_doc:
        gpu = mdev.info(dev).name if dev.type != "cpu" else None
        _doc.update_doc("backbone", doc_table(report), _doc.command_line("bench/backbone.py"), args.update_doc,
                        machine=_doc.machine_line(gpu=gpu, note=f"{args.dtype}, {torch.get_num_threads()} torch threads"))


def doc_table(report: list[dict]) -> str:
    """The rows as BENCHMARKS.md's table; a ratio column whose reference variant did not run is left out."""
    import math

    ratios = [(k, h) for k, h in (("vs_timm_eager", "vs timm eager"), ("vs_timm_compile", "vs timm compile"),
                                  ("vs_timm_bf16_autocast", "vs timm bf16 autocast")) if any(not math.isnan(r[k]) for r in report)]
    memory = any(r["peak_bytes"] is not None for r in report)
    headers = ["shape", "mode", "variant", "ms/step", "% of matmul rate", *(h for _, h in ratios), *(["step peak MiB"] if memory else [])]
    cells = [[f"{r['shape']} ({r['depth']} x {r['dim']}, batch {r['batch']} x {r['tokens']})", r["mode"], r["variant"], f"{r['ms']:.1f}",
              f"{r['pct_matmul']:.1f}%", *(f"{r[k]:.3f}x" for k, _ in ratios),
              *([("n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}")] if memory else [])] for r in report]
    table = _doc.md_table(headers, cells, align="lll" + "r" * (len(headers) - 3))
    return (table + "\n\nSame weights in every variant (the mmte encoder is converted from the timm model), median over interleaved "
            "rounds. \"% of matmul rate\": achieved GFLOP/s (GEMMs, attention matmuls, patch embedding; a training step counts 3x the "
            "forward) over the rate `F.linear` reaches at the layer's four GEMM shapes in fp32 in the same run, so bf16 rows can exceed "
            "100%. \"step peak MiB\": peak RSS growth during one warm step, in a fresh process per variant. Only the ratios compare "
            "across machines.")


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    main()
