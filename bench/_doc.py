"""BENCHMARKS.md is generated: each ``bench/`` script writes its own section between two markers.

A section is the text between ``<!-- bench:<name> -->`` and ``<!-- /bench:<name> -->``. A script run
with ``--update-doc`` renders its current results as one markdown table and calls :func:`update_doc`,
which puts the command that produced them and one machine line (CPU model, the flags that decide
which kernels run, cores, torch version, date, load) above the table and replaces the old section in
place; a section not yet in the file is appended under its own heading. Everything outside the
markers (the header, the headings, the history list) is written by hand and left alone.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "BENCHMARKS.md"

# the CPU flags that decide which GEMM kernels run (fp32 AVX2 / AVX-512, native bf16, AMX tiles)
HISTORY = "## History"  # the hand-written list of dated experiment pages closing BENCHMARKS.md

# the load when the script imported this module, i.e. when the benchmark started
LOAD_AT_START = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

MACHINE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def begin_marker(name: str) -> str:
    return f"<!-- bench:{name} -->"


def end_marker(name: str) -> str:
    return f"<!-- /bench:{name} -->"


def machine_line(gpu: str | None = None, note: str = "") -> str:
    """One line naming this machine: CPU model, the flags that matter, cores, torch, date and load.

    Args:
        gpu: the accelerator's name when the figures come from one (e.g. ``torch.cuda.get_device_name()``).
        note: appended as is (e.g. ``"2 torch threads"`` or ``"other jobs running"``).
    """
    import torch

    from mmte.device import cpu_info

    cpu = cpu_info()
    flags = " ".join(f for f in MACHINE_FLAGS if f in cpu.flags) or "none of " + "/".join(MACHINE_FLAGS)
    parts = [f"{cpu.model} (flags: {flags}; torch capability {cpu.capability})",
             f"{cpu.logical_cores} logical / {cpu.physical_cores} physical cores"]
    if gpu:
        parts.append(f"GPU {gpu}")
    parts.append(f"torch {torch.__version__}")
    parts.append(time.strftime("%Y-%m-%d", time.gmtime()))
    if LOAD_AT_START is not None:
        parts.append(f"load average {LOAD_AT_START:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    if note:
        parts.append(note)
    return "Machine: " + ", ".join(parts) + "."


def add_argument(parser, name: str) -> None:
    """Add ``--update-doc [PATH]`` to a bench script's ``parser`` (PATH: BENCHMARKS.md by default)."""
    parser.add_argument("--update-doc", nargs="?", const=str(DOC), default=None, metavar="PATH",
                        help=f"write this run's table into BENCHMARKS.md (or PATH), between the bench:{name} markers")


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The command that ran ``script`` (``bench/<name>.py``), quoted for a shell, without ``--update-doc [PATH]``.

    ``argv`` defaults to ``sys.argv[1:]``.
    """
    import shlex

    args, out, skip = list(sys.argv[1:] if argv is None else argv), [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "--update-doc":
            skip = i + 1 < len(args) and not args[i + 1].startswith("-") and args[i + 1].endswith(".md")
            continue
        if a.startswith("--update-doc="):
            continue
        out.append(shlex.quote(a))
    return " ".join(["python", script, *out])


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: Sequence[str] | None = None) -> str:
    """A markdown table; ``align`` holds ``"l"`` or ``"r"`` per column (default: left)."""
    rule = ["---:" if a == "r" else "---" for a in (align or ["l"] * len(headers))]
    if len(rule) != len(headers):
        raise ValueError(f"align has {len(rule)} entries; expected one per column ({len(headers)})")
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(headers):
            raise ValueError(f"table row {cells} has {len(cells)} cells; expected {len(headers)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(name: str, markdown: str, command: str, machine: str) -> str:
    """The section's text, markers included."""
    body = [begin_marker(name), "", f"`{command}`", "", machine, "", markdown.strip("\n"), "", end_marker(name)]
    return "\n".join(body)


def update_doc(name: str, markdown: str, command: str, path: str | os.PathLike = DOC, *, machine: str | None = None,
               title: str | None = None) -> Path:
    """Replace benchmark ``name``'s section of ``path`` with ``markdown`` (one current table and its notes).

    Args:
        name: the section's marker name (``<!-- bench:<name> -->``), by convention the script's name.
        markdown: what the script measured, rendered as markdown.
        command: the command that produced it, written above the table.
        path: the document (BENCHMARKS.md at the repository root by default).
        machine: the machine line; default :func:`machine_line` for this machine. Pass the stored one
            when the figures were measured elsewhere (results merged from saved JSON).
        title: the heading of a section appended to the file (default: ``name``), placed before the
            ``## History`` list when there is one; an existing section keeps its heading.

    Returns:
        The path written.
    """
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ValueError(f"section name {name!r} must be a plain word (letters, digits, '_' or '-')")
    path = Path(path)
    section = render(name, markdown, command, machine if machine is not None else machine_line())
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    begin, end = begin_marker(name), end_marker(name)
    if text.count(begin) > 1 or text.count(end) > 1:
        raise ValueError(f"{path} holds section {name!r} more than once; expected one {begin} ... {end} pair")
    if begin in text and end in text:
        start, stop = text.index(begin), text.index(end) + len(end)
        if stop < start:
            raise ValueError(f"{path}: {end} comes before {begin}; expected the end marker after the start")
        text = text[:start] + section + text[stop:]
    elif begin in text or end in text:
        raise ValueError(f"{path} holds only one of {begin} / {end}; expected both")
    else:  # a new section goes before the hand-written history list, or at the end
        new = f"## {title or name}\n\n{section}\n"
        at = text.find(f"\n{HISTORY}")
        text = text[: at + 1] + new + "\n" + text[at + 1 :] if at >= 0 else text.rstrip("\n") + "\n\n" + new
    path.write_text(text)
    return path
