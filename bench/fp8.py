"""FP8 benchmark: emulation overhead on the CPU; FP8 vs bf16 GEMMs and ViT-B/16 training steps on GPUs.

CPU (always runs). There is no FP8 arithmetic on this kind of CPU: the native backend *emulates* FP8
(quantize -> dequantize -> fp32 matmul), so these numbers measure the emulation's **overhead** over a
plain fp32 linear, not an FP8 speed-up. Per recipe and ViT-B/16 GEMM shape (QKV, projection, fc1,
fc2 with M = batch x 197 tokens, padded to 16), the time of one linear's forward + backward (three
GEMMs) is compared with ``nn.Linear`` in fp32; ``torch._scaled_mm`` on the CPU (the "hardware" path of
the tensorwise recipes) is timed as well.

CUDA with compute capability >= 8.9 (Ada, Hopper, Blackwell), when present:

* GEMM throughput: ``torch._scaled_mm`` (E4M3 x E4M3, per-tensor scales, bf16 out) vs a bf16 matmul,
  TFLOP/s at the ViT-B/16 shapes and a square 8192 GEMM;
* a ViT-B/16 training step (ImageTokenizer 224/16 + Backbone("vit-b16") + linear head, bf16 autocast,
  AdamW) in bf16 and under each recipe. Block and MX recipes are emulated in the native backend (their
  hardware kernels come with backend "te"), so expect them to be slower than bf16 there.

Each variant is timed for several rounds, interleaved so that background load hits all of them alike;
the median is reported. Output: a table on stdout and JSON in ``bench/results/fp8-<device>.json``.

Usage::

    python bench/fp8.py                 # CPU emulation overhead (batch 2: M = 394 -> 400 rows)
    python bench/fp8.py --batch 8       # bigger M
    python bench/fp8.py --device cuda   # + GPU GEMM TFLOP/s and ViT-B/16 steps (capability >= 8.9)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _doc
from mmte import device as mdev
from mmte import fp8

GEMMS = {"qkv": (768, 2304), "proj": (768, 768), "fc1": (768, 3072), "fc2": (3072, 768)}  # (K, N)
RECIPES = {
    "delayed": fp8.DelayedScaling(amax_history_len=16),
    "current": fp8.CurrentScaling(),
    "block": fp8.BlockScaling(),
    "mx": fp8.MXFP8(),
}


def _timeit(fns: dict, rounds: int, warmup: int, device) -> dict:
    """Median seconds per call of each fn, rounds interleaved across fns."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    mdev.synchronize(device)
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            mdev.synchronize(device)
            t = time.perf_counter()
            fn()
            mdev.synchronize(device)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _linear_fwd_bwd(lin, x, g, recipe=None):
    def run():
        lin.zero_grad(set_to_none=True)
        xx = x.detach().requires_grad_()
        with fp8.autocast(recipe=recipe, enabled=recipe is not None):
            y = lin(xx)
        y.backward(g)

    return run


def bench_cpu_emulation(batch: int, rounds: int) -> list[dict]:
    m = batch * 197
    rows = []
    for gname, (k, n) in GEMMS.items():
        torch.manual_seed(0)
        x = torch.randn(m, k)
        g = torch.randn(m, n) * 1e-2
        base = torch.nn.Linear(k, n)
        fns = {"fp32": _linear_fwd_bwd(base, x, g)}
        for rname, recipe in RECIPES.items():
            fns[rname] = _linear_fwd_bwd(fp8.FP8Linear.from_linear(base, recipe), x, g, recipe)
        sm = fp8.CurrentScaling(gemm="scaled_mm")
        fns["current+_scaled_mm"] = _linear_fwd_bwd(fp8.FP8Linear.from_linear(base, sm), x, g, sm)
        t = _timeit(fns, rounds, 1, "cpu")
        flops = 3 * 2 * m * k * n
        for name, sec in t.items():
            rows.append({
                "gemm": gname, "M": m, "K": k, "N": n, "variant": name, "ms": sec * 1e3,
                "gflops": flops / sec / 1e9, "overhead_vs_fp32": sec / t["fp32"],
            })
    return rows


def bench_gpu_gemms(device, rounds: int, batch: int) -> list[dict]:  # pragma: no cover - needs a GPU
    m = batch * 197
    m += (-m) % 16
    shapes = [(g, m, k, n) for g, (k, n) in GEMMS.items()] + [("square8192", 8192, 8192, 8192)]
    rows = []
    for gname, mm, k, n in shapes:
        a = torch.randn(mm, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        qa = fp8.quantize_tensorwise(a, fp8.E4M3, fp8.scale_from_amax(fp8.amax(a), 448.0))
        qb = fp8.quantize_tensorwise(b, fp8.E4M3, fp8.scale_from_amax(fp8.amax(b), 448.0))
        a8, b8t = qa.data.contiguous(), qb.data.contiguous().t()
        sa, sb = qa.scale_inv.float(), qb.scale_inv.float()
        fns = {
            "bf16": lambda a=a, b=b: a @ b.t(),
            "fp8_scaled_mm": lambda a8=a8, b8t=b8t, sa=sa, sb=sb: torch._scaled_mm(a8, b8t, sa, sb, out_dtype=torch.bfloat16),
            "fp8_scaled_mm_fast_accum": lambda a8=a8, b8t=b8t, sa=sa, sb=sb: torch._scaled_mm(a8, b8t, sa, sb, out_dtype=torch.bfloat16,
                                                                                              use_fast_accum=True),
        }
        t = _timeit(fns, rounds, 3, device)
        for name, sec in t.items():
            rows.append({"gemm": gname, "M": mm, "K": k, "N": n, "variant": name, "ms": sec * 1e3,
                         "tflops": 2 * mm * k * n / sec / 1e12, "speedup_vs_bf16": t["bf16"] / sec})
    return rows


def bench_gpu_vit_step(device, rounds: int, batch: int) -> list[dict]:  # pragma: no cover - needs a GPU
    from mmte.encoders import Backbone
    from mmte.tokenizers.image import ImageTokenizer

    class ViT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tokenizer = ImageTokenizer(768, 224, 16, 3)
            self.backbone = Backbone("vit-b16")
            self.head = torch.nn.Linear(768, 1000)

        def forward(self, x):
            return self.head(self.backbone(self.tokenizer(x).tokens)[:, 0])

    images = torch.randn(batch, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)
    rows = []
    for name, recipe in [("bf16", None)] + list(RECIPES.items()):
        torch.manual_seed(0)
        model = ViT().to(device)
        if recipe is not None:
            _ok, why = fp8.is_available(device, recipe)
            fp8.convert(model, recipe)
        else:
            why = "bf16 autocast"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, opt=opt, recipe=recipe):
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16), fp8.autocast(recipe=recipe, enabled=recipe is not None):
                loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        try:
            sec = _timeit({name: step}, rounds, 2, device)[name]
            rows.append({"variant": name, "batch": batch, "ms_per_step": sec * 1e3, "img_per_s": batch / sec, "path": why})
        except Exception as e:  # noqa: BLE001 - record and go on: one failing recipe should not hide the others
            rows.append({"variant": name, "batch": batch, "error": f"{type(e).__name__}: {e}"})
        del model, opt
    base = next((r for r in rows if r["variant"] == "bf16" and "ms_per_step" in r), None)
    for r in rows:
        if base is not None and "ms_per_step" in r:
            r["speedup_vs_bf16"] = base["ms_per_step"] / r["ms_per_step"]
    return rows


def _table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(cols, widths)) for r in rows]
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (emulation overhead) or cuda (adds the GPU sections)")
    p.add_argument("--batch", type=int, default=2, help="images per step: M = batch x 197 token rows (CPU default 2)")
    p.add_argument("--gpu-batch", type=int, default=32, help="images per ViT-B/16 step on the GPU")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads on the CPU")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    _doc.add_argument(p, "fp8")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = mdev.info(args.device)
    result = {
        "command": "python bench/fp8.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": {"type": info.type, "name": info.name, "capability": info.capability},
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "note": "CPU rows are the native backend's FP8 *emulation* (quantize/dequantize + fp32 matmul): "
                "overhead over fp32, not an FP8 speed-up.",
    }
    print(f"# FP8 benchmark on {info.type} ({info.name}), torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("# CPU: emulated FP8 linear forward+backward (3 GEMMs) vs fp32 nn.Linear - overhead, not speed-up")
    rows = bench_cpu_emulation(args.batch, args.rounds)
    result["cpu_emulation"] = rows
    print(_table(rows, ["gemm", "M", "K", "N", "variant", "ms", "gflops", "overhead_vs_fp32"]))
    if info.type == "cuda":  # pragma: no cover - needs a GPU
        ok, why = fp8.scaled_mm_capable(args.device)
        if ok:
            print("\n# GPU GEMMs: torch._scaled_mm E4M3 (per-tensor scales) vs bf16 matmul")
            g = bench_gpu_gemms(args.device, args.rounds * 4, args.gpu_batch)
            result["gpu_gemm"] = g
            print(_table(g, ["gemm", "M", "K", "N", "variant", "ms", "tflops", "speedup_vs_bf16"]))
            print(f"\n# GPU ViT-B/16 training step, batch {args.gpu_batch}, bf16 autocast (block/mx emulated)")
            v = bench_gpu_vit_step(args.device, args.rounds, args.gpu_batch)
            result["gpu_vit_b16_step"] = v
            print(_table(v, ["variant", "batch", "ms_per_step", "img_per_s", "speedup_vs_bf16", "error"]))
        else:
            result["gpu_skipped"] = why
            print(f"\n# GPU sections skipped: {why}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fp8-{info.type}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {path}")
    if args.update_doc:
        command = _doc.command_line("bench/fp8.py", argv)
        note = f"torch threads: {torch.get_num_threads()}"
        _doc.update_doc("fp8", doc_cpu(rows), command, args.update_doc, machine=_doc.machine_line(note=note))
        if "gpu_gemm" in result:  # pragma: no cover - needs a GPU
            _doc.update_doc("fp8-gpu", doc_gpu(result["gpu_gemm"], result["gpu_vit_b16_step"]), command, args.update_doc,
                            machine=_doc.machine_line(gpu=info.name, note=note), title="FP8 on a GPU")
    return result


def doc_cpu(rows: list[dict]) -> str:
    """The CPU emulation rows as BENCHMARKS.md's table: overhead over fp32, GEMM by GEMM."""
    table = _doc.md_table(["GEMM", "M x K x N", "variant", "ms", "GFLOP/s", "overhead vs fp32"],
                          [[r["gemm"], f"{r['M']} x {r['K']} x {r['N']}", r["variant"], f"{r['ms']:.1f}", f"{r['gflops']:.1f}",
                            f"{r['overhead_vs_fp32']:.2f}x"] for r in rows], align="lllrrr")
    return (table + "\n\nOne FP8 linear's forward + backward (three GEMMs) at ViT-B/16 GEMM shapes, median over interleaved rounds. "
            "This CPU has no FP8 arithmetic: the native backend emulates it (quantize/dequantize as the hardware does, fp32 "
            "matmul), so the figures are overheads over fp32, not speed-ups; `current+_scaled_mm` routes the GEMMs through "
            "`torch._scaled_mm`. Only the ratios compare: they are taken in the same rounds.")


def doc_gpu(gemms: list[dict], steps: list[dict]) -> str:  # pragma: no cover - needs a GPU
    """The GPU rows as BENCHMARKS.md's tables: E4M3 GEMM TFLOP/s vs bf16, then the ViT-B/16 training step per recipe."""
    g = _doc.md_table(["GEMM", "M x K x N", "variant", "ms", "TFLOP/s", "vs bf16"],
                      [[r["gemm"], f"{r['M']} x {r['K']} x {r['N']}", r["variant"], f"{r['ms']:.3f}", f"{r['tflops']:.1f}",
                        f"{r['speedup_vs_bf16']:.2f}x"] for r in gemms], align="lllrrr")
    s = _doc.md_table(["variant", "batch", "ms/step", "img/s", "vs bf16", "path or error"],
                      [[r["variant"], r["batch"], f"{r['ms_per_step']:.1f}" if "ms_per_step" in r else "-",
                        f"{r['img_per_s']:.1f}" if "img_per_s" in r else "-",
                        f"{r['speedup_vs_bf16']:.2f}x" if "speedup_vs_bf16" in r else "-", r.get("path", r.get("error", ""))]
                       for r in steps], align="lrrrrl")
    return g + "\n\nViT-B/16 training step (bf16 autocast; block and MX recipes emulated in the native backend):\n\n" + s


if __name__ == "__main__":
    main()
