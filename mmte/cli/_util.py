"""Small helpers the ``mmte`` command's modules share: plain values from parsed configs, warnings."""

from __future__ import annotations

import sys
from typing import Any


def plain(v: Any) -> Any:
    """A jsonargparse Namespace / tuple -> plain dicts and lists, for comparisons."""
    if hasattr(v, "as_dict"):
        v = v.as_dict()
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def short(v: Any, n: int = 80) -> str:
    """``repr`` of a plain value, cut to ``n`` characters."""
    s = repr(plain(v))
    return s if len(s) <= n else s[: n - 3] + "..."


def warn(msg: str) -> None:
    """One ``mmte: warning: ...`` line on stderr."""
    print(f"mmte: warning: {msg}", file=sys.stderr, flush=True)
