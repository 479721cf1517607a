"""``mmte list`` and ``mmte modalities``: what mmte knows by name (registered modalities, heads, presets,
backbone sources, strategies, shipped recipes and fragments), one line each."""

from __future__ import annotations

import argparse
import glob
import os
import re
from typing import Any

from ..errors import UnknownNameError

__all__ = ["LIST_SECTIONS", "list_entries", "list_main", "modalities_main", "modalities_table"]


def modalities_table() -> str:
    """A plain-text table of the registered modalities: tokenizer, default head, variable length, input."""
    from ..tokenizers.registry import get_modality, list_modalities

    rows = [("modality", "tokenizer", "default head", "var.len", "input")]
    for name in list_modalities():
        s = get_modality(name)
        head = s.default_head.get("name", "?")
        extra = ", ".join(f"{k}={v}" for k, v in s.default_head.items() if k != "name")
        rows.append((name, s.tokenizer.__name__, head + (f" ({extra})" if extra else ""), "yes" if s.variable_length else "no", s.description))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
        if j == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 5)
    return "\n".join(lines)


#: ``mmte list`` sections, in the order ``mmte list`` prints them
LIST_SECTIONS = ("modalities", "heads", "presets", "sources", "strategies", "recipes", "fragments")


def _first_sentence(text: str, limit: int = 120) -> str:
    """The first sentence of a docstring or YAML header (one line, at most ``limit`` characters)."""
    one = " ".join(text.split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", one)
    one = one[: m.start()] if m else one.rstrip(".")
    return one if len(one) <= limit else one[: limit - 3].rstrip() + "..."


def _yaml_header(path: str) -> str:
    """A YAML file's leading comment paragraph (its description)."""
    lines = []
    with open(path, encoding="utf-8") as fh:
        for ln in fh:
            if not ln.startswith("#"):
                break
            text = ln[1:].strip()
            if not text:
                if lines:
                    break
                continue
            lines.append(text)
    return " ".join(lines)


def _doc(obj: Any) -> str:
    import inspect

    return inspect.getdoc(obj) or ""


def _project_dir(name: str) -> str | None:
    """``recipes`` / ``configs``: the folder under the current directory, else the one beside the mmte package
    (an editable install of the repository)."""
    here = os.path.join(os.getcwd(), name)
    if os.path.isdir(here):
        return here
    beside = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), name)
    return beside if os.path.isdir(beside) else None


def _rel(path: str) -> str:
    r = os.path.relpath(path)
    return path if r.startswith("..") else r


def list_entries(section: str) -> list[tuple[str, str]]:
    """``(name, one-line description)`` rows of an ``mmte list`` section (see :data:`LIST_SECTIONS`)."""
    if section == "modalities":
        from ..tokenizers.registry import MODALITIES

        return [(n, f"{s.tokenizer.__name__}, default head {s.default_head.get('name')}: {(s.description or _first_sentence(_doc(s.tokenizer))).rstrip('.')}")
                for n, s in MODALITIES.items()]
    if section == "heads":
        from ..heads import HEADS

        return [(n, f"{c.__name__} ({getattr(c, 'task', None) or 'no task'}): {_first_sentence(_doc(c))}") for n, c in HEADS.items()]
    if section == "presets":
        from ..encoders.presets import PRESETS

        return [(n, f"{c.num_layers} layers x {c.hidden_size}, {c.num_attention_heads} attention heads, MLP {c.ffn_hidden_size}")
                for n, c in sorted(PRESETS.items())]
    if section == "sources":
        from ..encoders.sources import BACKBONE_SOURCES

        rows = [(n, desc) for n, (desc, _) in sorted(BACKBONE_SOURCES.items())]
        return rows + [("timm:<name>", "a timm ViT from the Hugging Face cache, e.g. timm:vit_base_patch16_clip_224.openai"),
                       ("hf:<org>/<name>", "a Hugging Face BERT / ViT / CLIP vision model from the cache, or hf:<local folder>"),
                       ("open_clip:<arch>/<tag>", "an OpenCLIP vision tower (pip install 'mmte[open_clip]')"),
                       ("<file>.safetensors", "an mmte convert output (it carries the backbone's shape)"),
                       ("<file>.pth", "the Meta-Transformer release's encoder weights")]
    if section == "strategies":
        from lightning.pytorch.strategies import StrategyRegistry

        from ..training.strategy import PRESETS

        rows = [(n, "mmte DP x TP x PP: " + (", ".join(f"{k}={v}" for k, v in kw.items()) or "FSDP2 over all ranks"))
                for n, kw in PRESETS.items()]
        return rows + [(n, f"Lightning: {StrategyRegistry[n].get('description', '')}") for n in StrategyRegistry.available_strategies()
                       if n not in PRESETS]
    if section in ("recipes", "fragments"):
        root = _project_dir("recipes" if section == "recipes" else "configs")
        if root is None:
            return []
        files = sorted(glob.glob(os.path.join(root, "*.yaml"))) if section == "recipes" else sorted(glob.glob(os.path.join(root, "*", "*.yaml")))
        return [(_rel(f), _first_sentence(_yaml_header(f))) for f in files]
    raise UnknownNameError("mmte list section", section, LIST_SECTIONS, "see mmte list --help")


def list_main(argv: list[str]) -> int:
    """``mmte list [section ...]``: registered and shipped names, one line each."""
    p = argparse.ArgumentParser(prog="mmte list", description="List what mmte can use by name, one line each: "
                                + ", ".join(LIST_SECTIONS) + " (default: all of them).")
    p.add_argument("sections", nargs="*", metavar="section", help="one or more of: " + ", ".join(LIST_SECTIONS))
    a = p.parse_args(argv)
    for s in a.sections:
        if s not in LIST_SECTIONS:
            raise UnknownNameError("mmte list section", s, LIST_SECTIONS, "see mmte list --help")
    sections = a.sections or list(LIST_SECTIONS)
    for i, s in enumerate(sections):
        rows = list_entries(s)
        if len(sections) > 1:
            print(("\n" if i else "") + f"{s}:")
        w = max((len(n) for n, _ in rows), default=0)
        indent = "  " if len(sections) > 1 else ""
        print("\n".join(f"{indent}{n.ljust(w)}  {d}" for n, d in rows))
    return 0


def modalities_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mmte modalities", description="List the registered modalities (built-ins and mmte.modalities plug-ins).")
    p.parse_args(argv)
    print(modalities_table())
    return 0

