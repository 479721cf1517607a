"""mmte's error vocabulary: one readable line for every mistake a user can fix.

Every error mmte raises for bad input says three things, in this order::

    <what is wrong>, <what was expected>, <how to fix it>

e.g. ``data.init_args.batch_size is 0, expected an int >= 1, set --data.init_args.batch_size 32``.
The ``mmte`` command prints it as ``mmte: error: <message>`` on stderr, with no traceback (set
``MMTE_DEBUG=1`` for one), and exits with :attr:`MMTEError.exit_code`:

* 2: the input is wrong (a recipe, a flag, a file, the data) -- :class:`UsageError` and its kinds;
* 1: a run failed on its own (a non-finite loss, a full disk) -- :class:`RunError`;
* 128 + signal number: stopped by SIGINT (130) or SIGTERM (143) after saving a checkpoint
  (:class:`Interrupted`).

The classes subclass the builtin exceptions library code already catches (``ValueError``,
``KeyError``, ``FileNotFoundError``), so raising them never changes who can catch what. This module is
a leaf: it imports nothing from mmte.
"""

from __future__ import annotations

import difflib
import signal as _signal
from collections.abc import Iterable

__all__ = [
    "DataError",
    "Interrupted",
    "MMTEError",
    "NonFiniteError",
    "RunError",
    "UnknownNameError",
    "UsageError",
    "closest",
    "known_and_closest",
]


class MMTEError(ValueError):
    """Base of mmte's errors: ``what, expected, fix`` joined into one line.

    Args:
        what: what is wrong, naming the offending value (``"model.lr is -1"``).
        expected: what was expected (``"expected a float > 0"``); may be empty.
        fix: how to fix it (``"set --model.lr 1e-3"``); may be empty.
    """

    exit_code = 2

    def __init__(self, what: str, expected: str = "", fix: str = ""):
        self.what, self.expected, self.fix = what, expected, fix
        super().__init__(", ".join(p for p in (what, expected, fix) if p))

    def __str__(self) -> str:  # KeyError-style quoting never applies
        return " ".join(str(self.args[0]).split("\n")) if self.args else ""

    def __reduce__(self):  # picklable across processes (what/expected/fix are not positional args)
        return (type(self), (self.what, self.expected, self.fix))


class UsageError(MMTEError):
    """A wrong recipe value, flag or path (exit status 2)."""


class UnknownNameError(UsageError, KeyError):
    """An unknown registry name (modality, head, preset, strategy, recipe...): lists the known ones and the
    closest match. Also a ``KeyError`` for dict-like callers."""

    def __init__(self, kind: str, name: object, known: Iterable[str], fix: str = ""):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"unknown {kind} {name!r}", known_and_closest(name, self.known), fix)

    def __reduce__(self):
        return (type(self), (self.kind, self.name, self.known, self.fix))


class DataError(UsageError):
    """Bad data (a file, a row, a sample): the message names the file and the row/column/sample index."""


class NonFiniteError(DataError):
    """A NaN or infinite value where finite numbers are required (data, weights, loss)."""


class RunError(MMTEError):
    """A run that failed by itself (non-finite loss, repeated bad FP8 scaling steps, a failed checkpoint
    write): exit status 1."""

    exit_code = 1


class Interrupted(SystemExit):
    """Raised at a step boundary after SIGINT/SIGTERM, once the resumable checkpoint is written.

    A ``SystemExit`` whose code is ``128 + signum`` (130 for SIGINT, 143 for SIGTERM), so that anything
    letting it through exits with the conventional status.
    """

    def __init__(self, signum: int, message: str = ""):
        super().__init__(128 + int(signum))
        self.signum, self.message = int(signum), message

    @property
    def signal_name(self) -> str:
        try:
            return _signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    def __str__(self) -> str:
        return self.message or f"interrupted by {self.signal_name}"

    def __reduce__(self):
        return (type(self), (self.signum, self.message))


def closest(name: object, known: Iterable[str], n: int = 1) -> list[str]:
    """The ``n`` closest matches of ``name`` among ``known`` (``difflib``; case-insensitive)."""
    known = list(known)
    lower = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(str(name).lower(), list(lower), n=n, cutoff=0.6)
    return [lower[h] for h in hits]


def known_and_closest(name: object, known: Iterable[str], limit: int = 24) -> str:
    """``"expected one of a, b, c (did you mean 'b'?)"``, the known list shortened past ``limit``."""
    known = sorted(known)
    shown = ", ".join(known[:limit]) + (f", ... ({len(known)} in all)" if len(known) > limit else "")
    hit = closest(name, known)
    return f"expected one of {shown or '(none registered)'}" + (f" (did you mean {hit[0]!r}?)" if hit else "")
