"""``mmte env``: versions, device, CPU flags and threads, for bug reports and benchmark tables."""

from __future__ import annotations

import argparse
import sys

__all__ = ["env_main", "env_report"]


def env_report() -> list[tuple[str, str]]:
    """``(name, value)`` rows: package versions, device, CPU model/capability/flags, cores, threads,
    the precision ``auto`` picks here."""
    import importlib.metadata as md

    import torch

    from .. import __version__
    from .. import device as mdev

    rows = [("mmte", __version__), ("torch", torch.__version__)]
    for pkg in ("lightning", "timm", "transformers", "onnx", "onnxruntime", "onnxscript"):
        try:
            rows.append((pkg, md.version(pkg)))
        except md.PackageNotFoundError:
            rows.append((pkg, "not installed"))
    c = mdev.cpu_info()
    dev = mdev.default_device().type
    rows += [
        ("python", sys.version.split()[0]),
        ("device", dev if dev == "cpu" else f"{dev} ({mdev.info(dev).name})"),
        ("cpu", c.model),
        ("cpu capability", f"{c.capability} (best matrix ISA: {c.isa})"),
        ("cpu flags", ", ".join(c.flags) or "none of note"),
        ("cores", f"{c.physical_cores} physical, {c.logical_cores} logical (this process's affinity)"),
        ("torch threads", str(torch.get_num_threads())),
        ("precision auto", "{} ({})".format(*mdev.choose_precision(dev))),
        ("inference prepack", _prepack_row()),
        ("inference small rows", _small_rows_row()),
    ]
    return rows


def _prepack_row() -> str:
    """Which CPU GEMM weights ``mmte predict`` / ``model.inference()`` prepack here (:mod:`mmte.inference.prepack`)."""
    import torch

    from ..inference.prepack import available

    kinds = [n for n, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)) if available(dt)]
    return f"{' and '.join(kinds)} GEMM weights (oneDNN blocked layout)" if kinds else "unavailable (no oneDNN in this torch build)"


def _small_rows_row() -> str:
    """Whether a bf16 inference copy runs inputs of a few rows in fp32 on fp16-packed weights here."""
    import torch

    from ..inference.prepack import SMALL_ROWS, available, small_available

    if not available(torch.bfloat16):
        return "off (no bf16 inference prepacking on this CPU)"
    if not small_available():
        return "off (this torch build has no fbgemm fp16-weight GEMM)"
    return f"<= {SMALL_ROWS} rows (batch x tokens) in fp32 on fp16-packed weights (fbgemm)"


def env_main(argv: list[str]) -> int:
    """``mmte env``: print the environment report (``--json`` for a JSON object)."""
    p = argparse.ArgumentParser(prog="mmte env", description="Versions, device, CPU flags and threads, for bug reports and benchmark tables.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    rows = env_report()
    if a.json:
        import json

        print(json.dumps(dict(rows)))
    else:
        w = max(len(k) for k, _ in rows)
        print("\n".join(f"{k.ljust(w)}  {v}" for k, v in rows))
    return 0

