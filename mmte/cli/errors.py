"""Errors as the ``mmte`` command shows them: one ``mmte: error: <what>, <expected>, <fix>`` line and an exit status.

:func:`describe_error` turns what a command raised into that line: mmte's own errors
(:mod:`mmte.errors`) as they are, a missing optional dependency with the extra that installs it,
jsonargparse's and Lightning's wrapped errors by their innermost cause. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import re
from typing import Any

from ..errors import MMTEError, UsageError, closest

__all__ = ["EXTRAS", "argparse_usage_error", "describe_error", "missing_extra"]

#: optional packages by import name -> the ``mmte[<extra>]`` that installs them (pyproject.toml's
#: ``[project.optional-dependencies]``)
EXTRAS = {
    "onnx": "export",
    "onnxruntime": "export",
    "onnxscript": "export",
    "litserve": "serve",
    "open_clip": "open_clip",
    "openwakeword": "speech",
    "transformer_engine": "te",
    "triton": "triton",
}

#: the Lightning verbs; their parse errors list the verb's options
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and its causes / contexts, outermost first."""
    seen, chain = e, [e]
    while (seen.__cause__ is not None or (seen.__context__ is not None and not seen.__suppress_context__)) and len(chain) < 32:
        seen = seen.__cause__ or seen.__context__
        chain.append(seen)
    return chain


def missing_extra(e: BaseException) -> str | None:
    """The one-line message for an import of an optional package that is not installed, else None."""
    for c in _chain(e):
        if isinstance(c, ImportError) and "pip install" in str(c):  # mmte's own message names the extra already
            return " ".join(str(c).split())
        name = getattr(c, "name", None) if isinstance(c, ImportError) else None
        top = name.split(".", 1)[0] if name else None
        if top in EXTRAS:
            extra = EXTRAS[top]
            return (f"the optional package {top} is not installed, expected the mmte[{extra}] extra for this command, "
                    f"install it: pip install 'mmte[{extra}]'")
    return None


def describe_error(e: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit status)`` for an error the user should see as one line, else None
    (a bug: the traceback is more useful)."""
    if isinstance(e, MMTEError):
        return str(e), e.exit_code
    extra = missing_extra(e)
    if extra:
        return extra, 2
    union = _union_reason(e)
    if union:
        return union, 2
    inner = _innermost(e)
    if inner is not e and isinstance(inner, MMTEError):
        return str(inner), inner.exit_code
    name = type(inner).__name__
    text = " ".join(str(inner.args[0] if isinstance(inner, KeyError) and inner.args else inner).split())
    if name == "MisconfigurationException" or isinstance(inner, (ValueError, TypeError, KeyError, FileNotFoundError, NotADirectoryError,
                                                                  IsADirectoryError, ImportError, argparse.ArgumentError)):
        return text or name, 2
    if name == "SafetensorError":
        return f"a .safetensors file is malformed ({text}), expected a file written by safetensors (e.g. mmte convert), replace the file", 2
    if isinstance(inner, OSError):
        return f"{text or name}, expected a readable input and writable output, check the path, permissions and free disk space", 1
    if isinstance(inner, RuntimeError) and "Error(s) in loading state_dict" in text:
        return f"{text[:400]}, expected a checkpoint of this model, use the recipe the checkpoint was trained with", 2
    return None


def _union_reason(e: BaseException) -> str | None:
    """jsonargparse reports a failed constructor of a ``Union`` option (e.g. ``trainer.strategy``) as a list
    of per-type errors; the one that is not a bare type mismatch is the user's mistake."""
    seen: BaseException | None = e
    while seen is not None:
        text = str(seen)
        if "Errors:" in text:
            for ln in text.split("Errors:", 1)[1].splitlines():
                ln = ln.strip()
                if ln.startswith("- ") and not ln[2:].startswith(("Expected a <class", "Not a valid subclass", "Does not validate")):
                    return " ".join(ln[2:].split())
        seen = seen.__cause__ or (seen.__context__ if not seen.__suppress_context__ else None)
    return None


def _innermost(e: BaseException) -> BaseException:
    """The deepest cause in the chain that is an mmte error (jsonargparse wraps errors raised in
    constructors), else the deepest cause."""
    chain = _chain(e)
    for c in reversed(chain):
        if isinstance(c, MMTEError):
            return c
    # prefer the deepest error raised by mmte code (not a wrapper jsonargparse built around it)
    for c in reversed(chain):
        tb = c.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None and f"{os.sep}mmte{os.sep}" in tb.tb_frame.f_code.co_filename:
            return c
    return chain[-1]


def argparse_usage_error(e: argparse.ArgumentError, parser: Any, argv: list[str]) -> UsageError:
    """jsonargparse's parse errors -> one mmte line (unknown options get the closest known one)."""
    raw = str(e.message if hasattr(e, "message") else e)
    entry = _entry_error(raw)
    if entry is not None:
        return entry
    msg = " ".join(raw.split())
    sub = argv[0] if argv and argv[0] in LIGHTNING_COMMANDS else None
    if "unrecognized arguments:" in msg:
        bad = [a for a in msg.split("unrecognized arguments:", 1)[1].split() if a.startswith("-")]
        flag = bad[0].split("=", 1)[0] if bad else msg
        hit = closest(flag, _option_strings(parser, sub))
        return UsageError(f"unknown option {flag}", f"expected an option listed by mmte {sub + ' ' if sub else ''}--help"
                          + (f" (did you mean {hit[0]}?)" if hit else ""), "fix the spelling or drop it")
    key = None
    if msg.startswith('Parser key "'):
        key, _, msg = msg[len('Parser key "') :].partition('":')
    what = f"--{key} has a value mmte cannot use: {msg.strip()}" if key else msg
    if len(what) > 400:
        what = what[:397] + "..."
    return UsageError(what, "expected a value of the type the option's help shows", f"see mmte {sub} --help" if sub else "see mmte --help")


_ENTRY_SECTION = re.compile(r'Parser key "(?:[\w.]*\.)?model\.(heads|tokenizers)"')


def _entry_error(raw: str) -> UsageError | None:
    """The parser's error for a ``model.heads`` / ``model.tokenizers`` entry (typed by :data:`mmte.config.HeadEntry`
    / :data:`mmte.config.TokenizerEntry`) as one line naming the entry, the option, the value and what was expected;
    None for other errors. jsonargparse nests the entry's error inside the section's Union error."""
    from .. import config

    m = _ENTRY_SECTION.search(raw)
    if m is None:
        return None
    section = m[1]
    kind, listing = ("head", "mmte list heads") if section == "heads" else ("tokenizer", "mmte list modalities")
    nested = re.search(r"NestedArg\(key='([^']*)'", raw)
    given = _given(raw, last=True)  # the section's value (nested errors come first)
    unknown = re.search(r"Option '([^']+)' is not accepted", raw)
    if unknown:
        opt = unknown[1]
        key = nested[1].split(".", 1)[0] if nested else _entry_with(given, opt)
        fields = [f.name for f in dataclasses.fields(config.HeadEntry if section == "heads" else config.TokenizerEntry)]
        hit = closest(opt, fields)
        return UsageError(f"--model.{section}.{key}.{opt}: no registered {kind} has the option {opt!r}",
                          f"expected one of {', '.join(fields)}" + (f" (did you mean {hit[0]!r}?)" if hit else ""),
                          f"fix the spelling or drop it ({listing} shows the {kind}s)")
    keys = [k for k in re.finditer(r'Parser key "([^"]+)"', raw) if not _ENTRY_SECTION.fullmatch(k[0])]
    if not keys:
        return None
    opt, rest = keys[-1][1], raw[keys[-1].end() :]
    subtypes = re.search(r"Subtypes: \[(.*)\]", rest) or re.search(r"Expected a (.*)", rest)
    value = _given(rest)
    key = nested[1].split(".", 1)[0] if nested else _entry_with(given, opt)
    expected = _type_text(subtypes[1]) if subtypes else "a value of the option's type"
    return UsageError(f"--model.{section}.{key}.{opt} is {value!r}", f"expected {expected}",
                      f"fix the value (no quotes around numbers; {listing} shows the {kind}s)")


def _given(text: str, last: bool = False) -> Any:
    """The first (or last) ``Given value: ...`` in ``text`` as a Python value where it reads as one."""
    found = list(re.finditer(r"Given value: (.*)", text))
    if not found:
        return None
    m = found[-1 if last else 0]
    try:
        return ast.literal_eval(m[1].strip())
    except (ValueError, SyntaxError):
        return m[1].strip()


def _entry_with(entries: Any, opt: str) -> str:
    """The key of the entry in ``entries`` (a section's value) that holds ``opt``; ``<entry>`` if none does."""
    if isinstance(entries, dict):
        for key, entry in entries.items():
            if isinstance(entry, dict) and opt in entry:
                return str(key)
    return "<entry>"


def _type_text(subtypes: str) -> str:
    """jsonargparse's ``<class 'float'>, <class 'NoneType'>`` as ``float or null``."""
    parts = re.split(r",\s*(?![^\[]*\])", subtypes)
    out = []
    for p in parts:
        p = re.sub(r"<class '(?:builtins\.)?([\w.]+)'>", r"\1", p.strip()).replace("typing.", "")
        p = re.sub(r"^Literal\[(.*)\]$", r"\1", p)
        out.append("null" if p == "NoneType" else p)
    return " or ".join(dict.fromkeys(out))


def _option_strings(parser: Any, sub: str | None) -> list[str]:
    p = parser
    if sub:
        try:
            p = parser._subcommands_action._name_parser_map[sub]
        except (AttributeError, KeyError):
            p = parser
    out = []
    for a in getattr(p, "_actions", []):
        out += [o for o in a.option_strings if o.startswith("--")]
    return sorted(set(out))
