"""Memory bandwidth of mmte's hand-written Triton kernels vs the unfused torch ops they replace.

For each transformer shape (tokens = batch x sequence, hidden D, MLP width 4D) and dtype it times,
forward and forward+backward:

* ``add+LayerNorm`` / ``add+RMSNorm``: :func:`mmte.te.kernels.fused_add_layer_norm` /
  ``fused_add_rms_norm`` (one kernel each way) vs ``h = x + r; F.layer_norm(h)`` op by op;
* ``bias+GELU`` / ``bias+quick_GELU``: ``bias_gelu`` / ``bias_quick_gelu`` on the fc1 output vs
  ``F.gelu(x + b)`` op by op;
* optionally (``--compile``) the same torch composition under ``torch.compile`` (inductor).

Effective GB/s counts the bytes the fused kernel must move at least (each input read once, each
output written once; the small per-row statistics and parameter vectors are left out) divided by the
measured time, for every variant alike -- so the GB/s ratio is the speed ratio, and the fused column
can be read against the GPU's peak bandwidth:

* add+norm forward: read x, r; write y, h (4 M D elements); backward: read dy, dh, h; write dx (4);
* bias+act forward: read x; write y (2 M F); backward: read dy, x; write dx (3).

Times are the median over ``--rounds`` rounds of ``--iters`` back-to-back calls, the variants
interleaved round by round. The kernels need a GPU: on a CPU-only machine the script says so and
measures nothing (Triton's CPU interpreter is a correctness tool, not a speed one).
``--dry-run`` runs every case once at tiny shapes under the interpreter to check the script and the
kernels' agreement, printing no speed.

Usage::

    python bench/kernels.py                        # CUDA: D=768,1024, 8x197 tokens, bf16 and fp32
    python bench/kernels.py --compile --dtypes bf16
    python bench/kernels.py --dry-run              # CPU: exercise the code path, no timings
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _doc
from mmte import device as mdev
from mmte.te import kernels

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cases(tokens: int, D: int, dtype: torch.dtype, dev: torch.device):
    """(name, bytes_fwd, bytes_bwd, inputs, fused_fn, torch_fn) for one shape.

    ``torch_fn`` is the library's own fallback (``impl="torch"``): the unfused composition, e.g.
    ``h = x + r`` then ``F.layer_norm(h)``, or ``F.gelu(x + b)``.
    """
    g = torch.Generator(device="cpu").manual_seed(0)

    def t(*shape, grad=True):
        return torch.randn(*shape, generator=g).to(device=dev, dtype=dtype).requires_grad_(grad)

    e = torch.tensor([], dtype=dtype).element_size()
    Fh = 4 * D
    out = []
    x, r, w, b = t(tokens, D), t(tokens, D), t(D), t(D)
    out.append(("add+LayerNorm", 4 * tokens * D * e, 4 * tokens * D * e, (x, r, w, b),
                lambda x, r, w, b: kernels.fused_add_layer_norm(x, r, w, b, 1e-5, impl="triton"),
                lambda x, r, w, b: kernels.fused_add_layer_norm(x, r, w, b, 1e-5, impl="torch")))  # fmt: skip
    out.append(("add+RMSNorm", 4 * tokens * D * e, 4 * tokens * D * e, (x, r, w),
                lambda x, r, w: kernels.fused_add_rms_norm(x, r, w, 1e-5, impl="triton"),
                lambda x, r, w: kernels.fused_add_rms_norm(x, r, w, 1e-5, impl="torch")))  # fmt: skip
    h, bh = t(tokens, Fh), t(Fh)
    out.append(("bias+GELU", 2 * tokens * Fh * e, 3 * tokens * Fh * e, (h, bh),
                lambda h, b: (kernels.bias_gelu(h, b, impl="triton"),),
                lambda h, b: (kernels.bias_gelu(h, b, impl="torch"),)))  # fmt: skip
    out.append(("bias+quick_GELU", 2 * tokens * Fh * e, 3 * tokens * Fh * e, (h, bh),
                lambda h, b: (kernels.bias_quick_gelu(h, b, impl="triton"),),
                lambda h, b: (kernels.bias_quick_gelu(h, b, impl="torch"),)))  # fmt: skip
    return out


def _step(fn, inputs, mode, cot):
    outs = fn(*inputs)
    if mode == "fwd+bwd":
        torch.autograd.grad(outs, inputs, cot)
    return outs


def time_case(fns: dict, inputs, mode: str, iters: int, rounds: int, warmup: int, dev) -> dict:
    """Median seconds per call for each variant in ``fns``, interleaved round by round."""
    with torch.no_grad():
        probe = fns["torch"](*inputs)
    cot = [torch.randn_like(o) for o in probe]
    ctx = torch.enable_grad if mode == "fwd+bwd" else torch.no_grad
    times = {k: [] for k in fns}
    with ctx():
        for fn in fns.values():
            for _ in range(warmup):
                _step(fn, inputs, mode, cot)
        mdev.synchronize(dev)
        for _ in range(rounds):
            for k, fn in fns.items():
                mdev.synchronize(dev)
                t0 = time.perf_counter()
                for _ in range(iters):
                    _step(fn, inputs, mode, cot)
                mdev.synchronize(dev)
                times[k].append((time.perf_counter() - t0) / iters)
    return {k: statistics.median(v) for k, v in times.items()}


def max_diff(fused, ref, inputs) -> float:
    with torch.no_grad():
        a, b = fused(*inputs), ref(*inputs)
    return max((p.float() - q.float()).abs().max().item() for p, q in zip(a, b))


def dry_run(args) -> None:
    """CPU: each case once at tiny shapes under Triton's interpreter; agreement only, no speed."""
    ok, why = kernels.available("cpu")
    if not ok:
        print(f"dry run impossible: {why}")
        return
    print("dry run (Triton interpreter on the CPU, tiny shapes): agreement with the torch composition only; no timings")
    print("| case | D | dtype | max abs diff fwd | max abs diff grads |")
    print("|---|---|---|---|---|")
    for D in (64, 96):
        for name, _, _, inputs, fused, ref in cases(6, D, torch.float32, torch.device("cpu")):
            outs_f, outs_r = fused(*inputs), ref(*inputs)
            cot = [torch.randn_like(o) for o in outs_r]
            gf = torch.autograd.grad(outs_f, inputs, cot)
            gr = torch.autograd.grad(outs_r, inputs, cot)
            gd = max((p - q).abs().max().item() for p, q in zip(gf, gr))
            fd = max((p - q).abs().max().item() for p, q in zip(outs_f, outs_r))
            print(f"| {name} | {D} | fp32 | {fd:.2e} | {gd:.2e} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="default: cuda when available")
    p.add_argument("--dims", default="768,1024")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=197)
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time torch.compile of the composition")
    p.add_argument("--dry-run", action="store_true", help="CPU: run each case once under TRITON_INTERPRET=1")
    p.add_argument("--json", default="bench/results/kernels.json")
    _doc.add_argument(p, "kernels")
    args = p.parse_args()

    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are built (they are built lazily)
        dry_run(args)
        return
    dev = torch.device(args.device or ("cuda" if mdev.is_available("cuda") else "cpu"))
    ok, why = kernels.available(dev)
    if dev.type != "cuda" or not ok:
        print(f"The Triton kernels need a CUDA GPU; device {dev} cannot run them ({why or 'not a CUDA device'}). "
              "Nothing measured. (`--dry-run` checks the script and the kernels' numbers under the interpreter.)")  # fmt: skip
        return
    tokens = args.batch * args.seq
    print(f"device={mdev.info(dev).name}, tokens={args.batch}x{args.seq}={tokens}, "
          f"median of {args.rounds} rounds x {args.iters} calls; GB/s = minimal fused traffic / time")  # fmt: skip
    lines = ["| case | D | dtype | mode | fused us | torch us | fused GB/s | torch GB/s | speedup |"
             + (" compile us | compile GB/s | fused vs compile |" if args.compile else "") + " max abs diff fwd |",
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if args.compile else "") + "---|"]  # fmt: skip
    print("\n".join(lines))
    report = []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for D in (int(d) for d in args.dims.split(",")):
            for name, bytes_f, bytes_b, inputs, fused, ref in cases(tokens, D, dtype, dev):
                fns = {"fused": fused, "torch": ref}
                if args.compile:
                    fns["compile"] = torch.compile(ref)
                diff = max_diff(fused, ref, inputs)
                for mode, nbytes in (("fwd", bytes_f), ("fwd+bwd", bytes_f + bytes_b)):
                    try:
                        t = time_case(fns, inputs, mode, args.iters, args.rounds, args.warmup, dev)
                    except Exception as e:  # noqa: BLE001 - e.g. a compile failure: report it, keep going
                        lines.append(f"| {name} | {D} | {dname} | {mode} | failed: {type(e).__name__}: {e} |")
                        print(lines[-1])
                        continue
                    gbs = {k: nbytes / v / 1e9 for k, v in t.items()}
                    row = {"case": name, "D": D, "tokens": tokens, "dtype": dname, "mode": mode, "bytes": nbytes,
                               "us": {k: v * 1e6 for k, v in t.items()}, "gbps": gbs,
                               "speedup_vs_torch": t["torch"] / t["fused"], "max_abs_diff_fwd": diff,
                               "device": mdev.info(dev).name}  # fmt: skip
                    line = (f"| {name} | {D} | {dname} | {mode} | {t['fused'] * 1e6:.1f} | {t['torch'] * 1e6:.1f} | "
                            f"{gbs['fused']:.0f} | {gbs['torch']:.0f} | {row['speedup_vs_torch']:.2f}x |")  # fmt: skip
                    if args.compile:
                        row["speedup_vs_compile"] = t["compile"] / t["fused"]
                        line += f" {t['compile'] * 1e6:.1f} | {gbs['compile']:.0f} | {row['speedup_vs_compile']:.2f}x |"
                    lines.append(line + f" {diff:.1e} |")
                    print(lines[-1])
                    report.append(row)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.json}")
    if args.update_doc:
        note = (f"Tokens {args.batch} x {args.seq} = {tokens}; median of {args.rounds} rounds x {args.iters} calls. GB/s: the least "
                "traffic the fused kernel must move (each input read once, each output written once) over the time, for every "
                "variant alike, so the GB/s ratio is the speed ratio and the fused column reads against the GPU's peak bandwidth.")
        _doc.update_doc("kernels", "\n".join(lines) + "\n\n" + note, _doc.command_line("bench/kernels.py"), args.update_doc,
                        machine=_doc.machine_line(gpu=mdev.info(dev).name))


if __name__ == "__main__":
    main()
