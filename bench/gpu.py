"""One prepared GPU run (< 8 minutes): bf16 and FP8 training steps against timm and TransformerEngine,
and mmte's Triton fused kernels against the torch.compile path.

Written for a CUDA machine and never run on one so far (see BENCHMARKS.md). On a machine without
CUDA it measures nothing, says why, writes the reason to the JSON and exits 0 (``--require-gpu``:
exit 1).

Sections (``--sections``, default all), ViT-B/16 shapes (``--shape``), batch ``--batch``:

* ``train``: one training step (forward, backward, SGD) in bf16 — timm under
  ``torch.autocast(bfloat16)``, timm compiled under autocast, mmte eager (the bf16 path),
  mmte fused (regional torch.compile), mmte ``fusion="kernels"`` (the Triton add+norm and
  bias+activation kernels), and ``backend="te"`` (TransformerEngine) when it imports.
* ``fp8``: the same step with mmte's FP8 linears (``mmte.fp8.convert`` + ``mmte.fp8.autocast``,
  delayed and current scaling; needs compute capability >= 8.9) and TransformerEngine's
  ``fp8_autocast`` when installed.
* ``kernels``: residual add + LayerNorm forward+backward at the layer's activation shape: the
  Triton kernel vs the torch composition compiled by inductor vs eager, in GB/s.

Every section times its variants in interleaved rounds (median over ``--rounds``) and stops adding
variants when ``--budget-s`` (default 420 s) is spent, saying which were left out. Prints markdown
tables with the GPU name and writes JSON (``--json``).

    python bench/gpu.py                          # everything, ~5-7 minutes on one GPU
    python bench/gpu.py --sections train --batch 64 --rounds 10
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _doc

SECTIONS = ("train", "fp8", "kernels")
SHAPES = {"vit-b16": (12, 768, 12), "vit-s16": (12, 384, 6), "vit-l16": (24, 1024, 16)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset of %(default)s")
    p.add_argument("--shape", default="vit-b16", choices=sorted(SHAPES))
    p.add_argument("--depth", type=int, default=0, help="layers (0: the shape's own)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=420.0, help="stop adding variants after this many seconds")
    p.add_argument("--device", default="cuda")
    p.add_argument("--require-gpu", action="store_true", help="exit 1 when no CUDA device is present")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "gpu.json"))
    _doc.add_argument(p, "gpu")
    a = p.parse_args(argv)
    a.sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in a.sections if s not in SECTIONS]
    if bad:
        p.error(f"unknown sections {bad}; choose from {list(SECTIONS)}")
    if a.batch < 1 or a.rounds < 1:
        p.error(f"--batch and --rounds must be >= 1; got {a.batch} and {a.rounds}")
    return a


def gpu_skip_reason(device: str) -> str | None:
    """Why this machine cannot run the benchmark, or None when it can."""
    if not device.startswith("cuda"):
        return f"--device {device}: this benchmark is for CUDA GPUs"
    if not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False): nothing measured"
    return None


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.skipped: list[str] = []

    def ok(self, what: str) -> bool:
        if time.monotonic() < self.end:
            return True
        self.skipped.append(what)
        return False


def _timed(fns: dict, rounds: int, warmup: int, budget: Budget, section: str) -> dict[str, float]:
    live = {}
    for name, fn in fns.items():
        if not budget.ok(f"{section}:{name}"):
            continue
        try:
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
            live[name] = fn
        except Exception as e:  # noqa: BLE001 - a variant that cannot run here is reported, not fatal
            print(f"  {section}:{name} left out: {type(e).__name__}: {str(e).splitlines()[0][:160]}", file=sys.stderr)
    times = {k: [] for k in live}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for k, fn in live.items():
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times[k].append(start.elapsed_time(end))
    return {k: statistics.median(v) for k, v in times.items()}


def _models(a):
    import timm

    from mmte.encoders import from_timm

    depth, dim, heads = SHAPES[a.shape]
    depth = a.depth or depth
    torch.manual_seed(0)
    src = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0, depth=depth, embed_dim=dim, num_heads=heads)
    return src, from_timm(src)


def _step(model, x, autocast: bool = True, ctx=contextlib.nullcontext):
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast), ctx():
            out = model.forward_features(x)
        out.float().pow(2).mean().backward()
        opt.step()

    return step


def train_section(a, budget: Budget) -> dict[str, float]:
    from mmte.te import te_available

    dev = torch.device(a.device)
    src, enc = _models(a)
    x = torch.randn(a.batch, 3, 224, 224, device=dev)
    fns = {"timm_bf16_autocast": _step(copy.deepcopy(src).to(dev), x)}
    tc = copy.deepcopy(src).to(dev)
    tc.compile()
    fns["timm_compiled_bf16"] = _step(tc, x)
    fns["mmte_bf16"] = _step(copy.deepcopy(enc).to(dev), x)
    fused = copy.deepcopy(enc).to(dev)
    fused.backbone.fuse()
    fns["mmte_fused_bf16"] = _step(fused, x)
    kern = copy.deepcopy(enc).to(dev)
    kern.backbone.fusion = "kernels"
    kern.backbone.fuse()
    fns["mmte_triton_kernels_bf16"] = _step(kern, x)
    ok, why = te_available()
    if ok:
        from mmte.encoders import Backbone

        te_enc = copy.deepcopy(enc)
        te_bb = Backbone(enc.backbone.config, backend="te")
        te_bb.load_state_dict(enc.backbone.state_dict())
        te_enc.backbone = te_bb
        fns["mmte_te_backend_bf16"] = _step(te_enc.to(dev), x)
    else:
        print(f"  train:mmte_te_backend_bf16 left out: {why}", file=sys.stderr)
    return _timed(fns, a.rounds, a.warmup, budget, "train")


def fp8_section(a, budget: Budget) -> dict[str, float]:
    from mmte import fp8
    from mmte.te import te_available

    dev = torch.device(a.device)
    cap = torch.cuda.get_device_capability(dev)
    _, enc = _models(a)
    x = torch.randn(a.batch, 3, 224, 224, device=dev)
    fns = {"mmte_bf16": _step(copy.deepcopy(enc).to(dev), x)}
    if cap >= (8, 9):
        for recipe in ("delayed", "current"):
            m = fp8.convert(copy.deepcopy(enc)).to(dev)
            fns[f"mmte_fp8_{recipe}"] = _step(m, x, ctx=lambda r=recipe: fp8.autocast(recipe=r))
    else:
        print(f"  fp8:mmte_fp8_* left out: compute capability {cap} < (8, 9) has no FP8 tensor cores", file=sys.stderr)
    ok, why = te_available()
    if ok and cap >= (8, 9):
        import transformer_engine.pytorch as te

        from mmte.encoders import Backbone

        te_enc = copy.deepcopy(enc)
        te_bb = Backbone(enc.backbone.config, backend="te")
        te_bb.load_state_dict(enc.backbone.state_dict())
        te_enc.backbone = te_bb
        fns["te_fp8_delayed"] = _step(te_enc.to(dev), x, ctx=lambda: te.fp8_autocast(enabled=True))
    elif not ok:
        print(f"  fp8:te_fp8_delayed left out: {why}", file=sys.stderr)
    return _timed(fns, a.rounds, a.warmup, budget, "fp8")


def kernels_section(a, budget: Budget) -> dict[str, float]:
    import torch.nn.functional as F

    from mmte.te import kernels

    dev = torch.device(a.device)
    _, dim, _ = SHAPES[a.shape]
    m = a.batch * 197
    x = torch.randn(m, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(m, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(dim, device=dev, requires_grad=True)
    b = torch.zeros(dim, device=dev, requires_grad=True)
    g = torch.randn(m, dim, device=dev, dtype=torch.bfloat16)

    def composition(x, r, w, b):
        h = x + r
        return F.layer_norm(h, (dim,), w.to(h.dtype), b.to(h.dtype), 1e-5), h

    compiled = torch.compile(composition)

    def run(fn):
        def go():
            y, h = fn(x, r, w, b)
            torch.autograd.backward([y, h], [g, g])

        return go

    fns = {"eager": run(composition), "torch_compile": run(compiled)}
    ok, why = kernels.available(dev)
    if ok:
        fns["triton_kernel"] = run(lambda x, r, w, b: kernels.fused_add_layer_norm(x, r, w, b, 1e-5))
    else:
        print(f"  kernels:triton_kernel left out: {why}", file=sys.stderr)
    ms = _timed(fns, a.rounds, a.warmup, budget, "kernels")
    nbytes = 8 * m * dim * 2  # fwd: read x, r; write y, h; bwd: read dy, dh, h; write dx (bf16)
    return {k: v for k, v in ms.items()} | {f"{k}_GBps": nbytes / (v / 1e3) / 1e9 for k, v in ms.items()}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    why = gpu_skip_reason(a.device)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    if why:
        print(f"bench/gpu.py: {why}")
        Path(a.json).write_text(json.dumps({"skipped": why, "sections": a.sections}))
        return 1 if a.require_gpu else 0
    name = torch.cuda.get_device_name(a.device)
    print(f"GPU {name} (capability {torch.cuda.get_device_capability(a.device)}), torch {torch.__version__}, "
          f"shape {a.shape}, batch {a.batch}, {a.rounds} rounds")
    budget = Budget(a.budget_s)
    report = {"gpu": name, "shape": a.shape, "batch": a.batch}
    for section in a.sections:
        res = {"train": train_section, "fp8": fp8_section, "kernels": kernels_section}[section](a, budget)
        report[section] = res
        base_key = {"train": "timm_bf16_autocast", "fp8": "mmte_bf16", "kernels": "eager"}[section]
        base = res.get(base_key)
        print(f"\n### {section}\n| variant | ms | vs {base_key} |\n|---|---:|---:|")
        for k, v in res.items():
            if k.endswith("_GBps"):
                continue
            extra = f" ({res[k + '_GBps']:.0f} GB/s)" if k + "_GBps" in res else ""
            print(f"| {k} | {v:.2f}{extra} | {base / v:.2f}x |" if base else f"| {k} | {v:.2f}{extra} | - |")
    report["left_out_for_time"] = budget.skipped
    if budget.skipped:
        print(f"\nleft out to stay within {a.budget_s:.0f} s: {budget.skipped}")
    Path(a.json).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {a.json}")
    if a.update_doc:
        _doc.update_doc("gpu", doc_table(report, a), _doc.command_line("bench/gpu.py", argv), a.update_doc,
                        machine=_doc.machine_line(gpu=name))
    return 0


BASELINES = {"train": "timm_bf16_autocast", "fp8": "mmte_bf16", "kernels": "eager"}


def doc_table(report: dict, a: argparse.Namespace) -> str:
    """The sections' variants as one BENCHMARKS.md table, each against its section's baseline."""
    rows = []
    for section in a.sections:
        res = report.get(section, {})
        base = res.get(BASELINES[section])
        for k, v in res.items():
            if not k.endswith("_GBps"):
                gbs = f"{res[k + '_GBps']:.0f}" if k + "_GBps" in res else ""
                rows.append([section, k, f"{v:.2f}", gbs, f"{base / v:.2f}x vs {BASELINES[section]}" if base else "-"])
    table = _doc.md_table(["section", "variant", "ms", "GB/s", "speed"], rows, align="llrrr")
    left = f"\n\nLeft out to stay within {a.budget_s:.0f} s: {', '.join(report['left_out_for_time'])}." if report.get("left_out_for_time") else ""
    return (table + f"\n\nShape {a.shape}, batch {a.batch}, median of {a.rounds} interleaved rounds: `train` and `fp8` are one training "
            "step (forward, backward, SGD), `kernels` the residual add + LayerNorm forward and backward at the layer's activation "
            "shape." + left)


if __name__ == "__main__":
    sys.exit(main())
