"""Batched prediction latency and throughput of an mmte model, the way ``mmte predict`` runs it.

The model is the quickstart's (an 8x8 image tokenizer + classification head in front of the frozen
all-MiniLM-L6-v2 trunk) or any recipe's (``--recipe``), optionally with a checkpoint's weights
(``--ckpt``). Inputs are real samples of the recipe's data (validation split), batched. Each variant
runs in eval mode under ``torch.inference_mode``:

* ``eager-fp32``: the plain model;
* ``fused-fp32``: the backbone's layers compiled as regional ``torch.compile`` (``Backbone.fuse()``,
  what ``model.fuse_for_inference: true`` does);
* ``eager-bf16`` / ``fused-bf16``: the same under ``torch.autocast(bfloat16)`` (``--bf16``; slow on
  CPUs without bf16 units, e.g. AVX2-only ones).

For each batch size: median latency per batch (ms) over ``--iters`` timed runs after ``--warmup``
runs, and throughput (samples/s). Prints a table and writes JSON (``--out``).

    python bench/predict.py                                  # quickstart, batch 1/32/256, fp32 eager+fused
    python bench/predict.py --bf16 --batch-sizes 1 64 --iters 20
    python bench/predict.py --recipe recipes/fsdd_audio.yaml --ckpt runs/fsdd_audio/checkpoints/last.ckpt
    python bench/predict.py --dry-run                        # tiny backbone, 1 iteration: a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def build(recipe: str, ckpt: str | None, extra: list[str]):
    """The recipe's model (with the checkpoint's weights) and one large batch source."""
    from mmte.cli import MMTECLI

    root = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"mmte-bench-predict-{os.getpid()}")
    cli = MMTECLI(args=["--config", recipe, *extra, "--trainer.default_root_dir", root, "--trainer.logger", "false"], run=False)
    module, dm = cli.model, cli.datamodule
    module.configure_model()
    if ckpt:
        ck = torch.load(ckpt, map_location="cpu", weights_only=False)
        module.on_load_checkpoint(ck)
        module.load_state_dict(ck["state_dict"], strict=True)
    module._reload_pretrained()
    dm.setup("predict")
    return module, dm


def batches(dm, size: int, n: int):
    """``n`` real batches of ``size`` samples from the predict split (cycling)."""
    ds = dm.datasets[dm.predict_split]
    out, i = [], 0
    for _ in range(n):
        idx = [(i + k) % len(ds) for k in range(size)]
        i += size
        out.append(dm._collate([ds[j] for j in idx]))
    return out


def timed(model, data, warmup: int, iters: int, bf16: bool) -> list[float]:
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    times = []
    with torch.inference_mode(), ctx:
        for k in range(warmup + iters):
            b = data[k % len(data)]
            t = time.perf_counter()
            model(b)
            dt = time.perf_counter() - t
            if k >= warmup:
                times.append(dt)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=str(ROOT / "recipes" / "quickstart.yaml"))
    p.add_argument("--ckpt", default=None, help="checkpoint whose weights to load (trainable-only ones work)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--bf16", action="store_true", help="also run bf16 autocast variants")
    p.add_argument("--no-fused", action="store_true", help="skip the torch.compile'd backbone")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "predict.json"))
    p.add_argument("--dry-run", action="store_true", help="tiny backbone, batch 2, 1 iteration (checks the script runs)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    extra: list[str] = []
    if a.dry_run:
        extra = ["--config", str(ROOT / "configs" / "encoders" / "tiny.yaml")]
        a.batch_sizes, a.warmup, a.iters, a.no_fused = [2], 0, 1, True
    module, dm = build(a.recipe, a.ckpt, extra)
    module.eval()
    variants = [("eager", False)] + ([] if a.no_fused else [("fused", True)])
    dtypes = [False] + ([True] if a.bf16 else [])
    results = []
    for fused_name, fused in variants:
        model = copy.deepcopy(module.model).eval()
        if fused:
            model.backbone.fuse()
        for bf16 in dtypes:
            name = f"{fused_name}-{'bf16' if bf16 else 'fp32'}"
            for bs in a.batch_sizes:
                data = batches(dm, bs, 3)
                ts = timed(model, data, a.warmup + (2 if fused else 0), a.iters, bf16)
                med = statistics.median(ts)
                results.append({"variant": name, "batch_size": bs, "latency_ms": med * 1e3, "throughput": bs / med,
                                "min_ms": min(ts) * 1e3, "iters": len(ts)})
                print(f"{name:11s} batch {bs:4d}: {med * 1e3:9.2f} ms/batch  {bs / med:10.1f} samples/s", flush=True)
    print()
    print("| variant | batch | latency ms (median) | samples/s |")
    print("|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['variant']} | {r['batch_size']} | {r['latency_ms']:.2f} | {r['throughput']:.1f} |")
    meta = {
        "command": "python bench/predict.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "recipe": os.path.relpath(a.recipe, ROOT) if os.path.isabs(a.recipe) else a.recipe,
        "ckpt": a.ckpt,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "backbone": module.model.backbone.config.__dict__,
    }
    if not a.dry_run:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
        print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
