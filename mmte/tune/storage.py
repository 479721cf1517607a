"""Where a study lives: an SQLite file or Optuna's journal file, and the pruner the trials share.

A storage is named by a path or URL: ``sqlite:///runs/tune/study.db`` (or any SQLAlchemy URL), a file
ending in ``.db``/``.sqlite``/``.sqlite3`` (SQLite), or any other file (Optuna's journal file, which
needs no database and suits network file systems). Both survive a killed ``mmte tune``: the study
continues where it stopped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["PRUNED_ATTR", "PRUNER_ATTR", "make_pruner", "open_storage", "storage_url"]

#: the study's user attribute holding the pruner settings (the trial processes build the same pruner)
PRUNER_ATTR = "mmte_pruner"
#: the trial's user attribute set when the pruner stopped it (its value: the validation index)
PRUNED_ATTR = "pruned_at"


def storage_url(path_or_url: str) -> str:
    """The canonical name of a storage: an SQLAlchemy URL, or ``journal:<absolute path>``."""
    if "://" in path_or_url:
        return path_or_url
    if path_or_url.startswith("journal:"):
        return "journal:" + os.path.abspath(path_or_url[len("journal:"):])
    full = os.path.abspath(path_or_url)
    if full.endswith((".db", ".sqlite", ".sqlite3")):
        return f"sqlite:///{full}"
    return f"journal:{full}"


def open_storage(path_or_url: str) -> Any:
    """An Optuna storage for :func:`storage_url`'s name (its folder created)."""
    import optuna

    url = storage_url(path_or_url)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = url[len("journal:"):]
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(path))
    if url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(url[len("sqlite:///"):]) or ".", exist_ok=True)
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None)


def make_pruner(settings: Mapping[str, Any] | None) -> Any:
    """Optuna's pruner for ``{"name": "median" | "none", "startup_trials": n, "warmup_steps": n}``."""
    import optuna

    s = dict(settings or {})
    if s.get("name", "median") == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=int(s.get("startup_trials", 2)), n_warmup_steps=int(s.get("warmup_steps", 0)))
