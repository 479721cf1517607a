"""Inference latency and throughput: mmte's inference path against timm, torch.compile and onnxruntime.

Two models, each with the same weights in every variant:

* ``vit-s16``: ViT-S/16 (12 layers x 384, 6 heads, 224^2 images -> 197 tokens), feature extraction
  (``forward_features``); the mmte encoder is converted from the timm model (``from_timm``).
* ``quickstart``: the quickstart recipe's model (8x8 image tokenizer + classification head in front of
  the 6-layer MiniLM trunk; random head weights: speed does not depend on them) on real digits.

Variants (those that apply to a model):

* ``timm-fp32``, ``timm-bf16-autocast``, ``timm-compiled`` (fp32, ``torch.compile``): ViT-S only;
* ``torch-fp32``, ``torch-bf16-autocast``: the mmte model as trained, eager (quickstart's baseline);
* ``ort-fp32``: onnxruntime on the model exported by ``mmte.export`` (dynamo exporter);
  ``ort-int8``: the same graph after ``onnxruntime.quantization.quantize_dynamic`` (int8 weights);
* ``mmte-inference``: ``MetaTransformer.inference()`` / ``mmte.inference.optimize`` with the dtype
  ``auto`` picks here (bf16 on CPUs with avx512_bf16/AMX), eager; ``mmte-inference-compiled``: the
  same with compiled backbone layers (dynamic batch).

Each batch size runs the variants in interleaved rounds (every round times each variant ``--iters``
calls in turn, so background load hits them alike); the figure is the median over rounds of the
per-call latency. Ratios are taken within the run. Prints a markdown table (with the CPU flags) and
writes JSON.

    python bench/predict.py                                   # both models, batch 1 and 32
    python bench/predict.py --models vit-s16 --batch-sizes 1 32 --rounds 7 --threads 2
    python bench/predict.py --dry-run                         # tiny shapes, one round: checks the script runs
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _doc
from mmte import device as mdev
from mmte.inference import optimize, resolve_dtype

MODELS = ("vit-s16", "quickstart")


# ------------------------------------------------------------------------------------ models
class Features(torch.nn.Module):
    """``forward_features`` as ``forward`` (what is exported and timed for ViT-S)."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        return self.m.forward_features(x)


def vit_s16(dry: bool):
    import timm

    from mmte.encoders import from_timm

    torch.manual_seed(0)
    kw = {"depth": 1, "embed_dim": 64, "num_heads": 2} if dry else {}
    src = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0, **kw).eval()
    enc = from_timm(src).eval()
    return src, enc


def quickstart(dry: bool):
    from mmte.cli import MMTECLI

    root = os.path.join(tempfile.gettempdir(), f"mmte-bench-predict-{os.getpid()}")
    extra = ["--config", str(ROOT / "configs" / "encoders" / "tiny.yaml")] if dry else []
    cli = MMTECLI(args=["--config", str(ROOT / "recipes" / "quickstart.yaml"), *extra, "--trainer.default_root_dir", root,
                        "--trainer.logger", "false"], run=False)
    module, dm = cli.model, cli.datamodule
    module.configure_model()
    module._reload_pretrained()
    dm.setup("predict")
    return module.model.eval(), dm


def real_batch(dm, n: int) -> dict:
    ds = dm.datasets[dm.predict_split]
    return {k: v for k, v in dm._collate([ds[i % len(ds)] for i in range(n)]).items() if k == "image"}


# ---------------------------------------------------------------------------------- variants
def ort_session(path: str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # onnxruntime's worker threads spin for a while after each run by default; in interleaved rounds
    # that spinning takes the cores from whichever variant is timed next (it made mmte's batch-1
    # latency read 26 ms instead of 5 ms in an earlier run of this script), so they sleep instead
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def onnx_variants(flat_model, example, names, tmp: str, threads: int) -> dict:
    """``{"ort-fp32": fn, "ort-int8": fn}`` over one exported graph (int8 left out when quantisation fails)."""
    from mmte.export import _dynamic_shapes

    path = os.path.join(tmp, "model.onnx")
    prog = torch.onnx.export(flat_model, example, dynamo=True, dynamic_shapes=_dynamic_shapes(flat_model), input_names=names,
                             opset_version=18, optimize=True, verbose=False)
    prog.save(path)
    out = {}
    sess = ort_session(path, threads)
    out["ort-fp32"] = lambda *xs, s=sess: s.run(None, {n: x.numpy() for n, x in zip(names, xs, strict=True)})
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        q = os.path.join(tmp, "model.int8.onnx")
        quantize_dynamic(path, q, weight_type=QuantType.QInt8)
        qs = ort_session(q, threads)
        out["ort-int8"] = lambda *xs, s=qs: s.run(None, {n: x.numpy() for n, x in zip(names, xs, strict=True)})
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"  ort-int8 left out: {type(e).__name__}: {e}", file=sys.stderr)
    return out


class _Flat(torch.nn.Module):
    """Positional tensor input -> first output tensor (for the ViT feature extractor)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.input_names = ["x"]
        self.example_inputs = ()

    def forward(self, *inputs):
        return self.model(*inputs)


def variants_for(model_name: str, args, tmp: str) -> tuple[dict, callable]:
    """``({variant: fn(batch_size) -> None-returning call}, make_inputs(bs))``."""
    from mmte.export import FlatModel

    threads = torch.get_num_threads()

    def ac(f):
        return lambda *a: _autocast(f, *a)
    if model_name == "vit-s16":
        src, enc = vit_s16(args.dry_run)
        size = 224

        def inputs(bs):
            g = torch.Generator().manual_seed(bs)
            return (torch.randn(bs, 3, size, size, generator=g),)

        timm_f = Features(src)
        v = {"timm-fp32": timm_f, "timm-bf16-autocast": ac(timm_f)}
        if not args.no_compile:
            tc = copy.deepcopy(src)
            tc.compile(dynamic=True)
            v["timm-compiled"] = Features(tc)
        flat = _Flat(Features(enc)).eval()
        flat.example_inputs = inputs(2)
        v.update(onnx_variants(flat, flat.example_inputs, ["x"], tmp, threads))
        inf = optimize(Features(enc), args.dtype)
        v[f"mmte-inference-{inf.dtype}"] = inf
        if not args.no_compile:
            v[f"mmte-inference-{inf.dtype}-compiled"] = optimize(Features(enc), args.dtype, compile=True, compile_min_batch=1)
        return v, inputs
    model, dm = quickstart(args.dry_run)

    def inputs(bs):
        return (real_batch(dm, bs),)

    flat = FlatModel(model, inputs(2)[0])
    v = {"torch-fp32": model, "torch-bf16-autocast": ac(model)}
    ov = onnx_variants(flat, flat.example_inputs, flat.input_names, tmp, threads)
    v.update({k: (lambda b, f=f: f(b["image"])) for k, f in ov.items()})
    inf = optimize(model, args.dtype)
    v[f"mmte-inference-{inf.dtype}"] = inf
    if not args.no_compile:
        v[f"mmte-inference-{inf.dtype}-compiled"] = optimize(model, args.dtype, compile=True, compile_min_batch=1)
    return v, inputs


def _autocast(f, *a):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return f(*a)


def run_model(model_name: str, args) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        variants, inputs = variants_for(model_name, args, tmp)
        rows = []
        for bs in args.batch_sizes:
            x = inputs(bs)
            times = {k: [] for k in variants}
            with torch.inference_mode():
                for k, f in variants.items():  # warm-up (compiles)
                    t = time.perf_counter()
                    for _ in range(args.warmup):
                        f(*x)
                    print(f"  {model_name} batch {bs} {k}: warm-up {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
                for _ in range(args.rounds):
                    for k, f in variants.items():
                        t = time.perf_counter()
                        for _ in range(args.iters):
                            f(*x)
                        times[k].append((time.perf_counter() - t) / args.iters)
            base_key = "timm-fp32" if "timm-fp32" in times else "torch-fp32"
            base, ort = statistics.median(times[base_key]), statistics.median(times.get("ort-fp32") or [float("nan")])
            for k, ts in times.items():
                m = statistics.median(ts)
                rows.append({"model": model_name, "variant": k, "batch": bs, "latency_ms": m * 1e3, "samples_per_s": bs / m,
                             "vs_baseline": base / m, "baseline": base_key, "vs_ort_fp32": ort / m, "rounds": len(ts),
                             "spread": (max(ts) - min(ts)) / m})
        return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: %(default)s")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=3, help="calls per variant per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dtype", default="auto", help="mmte inference dtype (auto|bf16|fp32|fp8; default %(default)s)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile variants (slow to warm up)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "predict.json"))
    p.add_argument("--dry-run", action="store_true", help="tiny shapes, batch 2, one round, no compile")
    _doc.add_argument(p, "predict")
    a = p.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {bad}; choose from {list(MODELS)}")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.dry_run:
        a.batch_sizes, a.rounds, a.iters, a.warmup, a.no_compile = [2], 1, 1, 1, True
    header = mdev.describe()
    print(f"{header}; mmte inference dtype {a.dtype} -> {resolve_dtype(a.dtype)}; torch {torch.__version__}")
    rows = []
    for m in models:
        rows += run_model(m, a)
    print("\n" + table(rows))
    if not a.dry_run:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        meta = {"command": "python bench/predict.py " + " ".join(sys.argv[1:] if argv is None else argv), "machine": header,
                "cpu_flags": list(mdev.cpu_info().flags), "torch": torch.__version__, "threads": torch.get_num_threads()}
        Path(a.out).write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
        print(f"\nwrote {a.out}")
    if a.update_doc and not a.dry_run:
        note = f"{torch.get_num_threads()} torch threads, mmte inference dtype {a.dtype} -> {resolve_dtype(a.dtype)}"
        _doc.update_doc("predict", table(rows) + "\n\n" + NOTE, _doc.command_line("bench/predict.py", argv), a.update_doc,
                        machine=_doc.machine_line(note=note))
    return 0


NOTE = ("Median latency per call over interleaved rounds; \"spread\": (max - min) / median over the rounds. Baselines: timm fp32 "
        "(ViT-S/16) or the torch fp32 model (quickstart); `ort-*` run the graph exported by `mmte.export` in onnxruntime "
        "(`ort-int8`: its dynamic int8 quantisation); `mmte-inference-*` is `mmte.inference.optimize`'s copy.")


def table(rows: list[dict]) -> str:
    """The rows as one markdown table (stdout and BENCHMARKS.md)."""
    return _doc.md_table(["model", "variant", "batch", "latency ms", "samples/s", "vs baseline", "vs ort-fp32", "spread"],
                         [[r["model"], r["variant"], r["batch"], f"{r['latency_ms']:.2f}", f"{r['samples_per_s']:.1f}",
                           f"{r['vs_baseline']:.2f}x ({r['baseline']})", f"{r['vs_ort_fp32']:.2f}x", f"{100 * r['spread']:.0f}%"] for r in rows],
                         align="llrrrrrr")


if __name__ == "__main__":
    sys.exit(main())
