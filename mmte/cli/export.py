"""``mmte export``: a recipe's model with a checkpoint's weights -> ONNX or a ``torch.export`` program.

The export itself (building the recipe, the check against eager) is :func:`mmte.export.export_main`;
this command hands it the CLI class and a ``--ckpt_path`` resolved as every other verb resolves it
(``best`` / ``last`` name the files in the recipe's checkpoint folder).
"""

from __future__ import annotations

import argparse

from .checkpoint import NAMED, checkpoint_dir, resolve_ckpt_path

__all__ = ["export_main"]

#: ``mmte export``'s own options (the rest of the command line is the recipe's)
_OWN = ("--format", "--out", "--opset", "--batch_size")


def export_main(argv: list[str]) -> int:
    """``mmte export``: see :func:`mmte.export.export_main`."""
    from ..export import export_main as run
    from .app import MMTECLI

    return run(_with_named_checkpoint(argv, MMTECLI), MMTECLI)


def _with_named_checkpoint(argv: list[str], cli_class: type) -> list[str]:
    """``argv`` with ``--ckpt_path best|last`` replaced by the file it names in the recipe's checkpoint folder."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--ckpt_path")
    for flag in _OWN:
        p.add_argument(flag)
    a, recipe = p.parse_known_args(argv)
    if a.ckpt_path not in NAMED or not any(r in ("--config", "-c") or r.startswith("--config=") for r in recipe):
        return argv
    config = cli_class(args=recipe, run=False, parse_only=True).config
    path = resolve_ckpt_path(a.ckpt_path, checkpoint_dir(config), "export")
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--ckpt_path" and i + 1 < len(argv):
            out += ["--ckpt_path", path]
            i += 2
            continue
        out.append(f"--ckpt_path={path}" if argv[i].startswith("--ckpt_path=") else argv[i])
        i += 1
    return out
