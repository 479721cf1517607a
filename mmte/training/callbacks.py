"""Callbacks: atomic checkpoints with stable names, and a prediction writer (CSV / JSON).

* :class:`MMTECheckpoint` is Lightning's ``ModelCheckpoint`` with stable names and atomic writes:

  - ``last.ckpt`` is always the latest step: it is rewritten at every epoch end (and every other save),
    not only when a new best is found, and it is what ``--ckpt_path last`` resumes;
  - ``best.ckpt`` is the best checkpoint by the monitored metric (``monitor="auto"``: the module's
    ``primary_metric``, e.g. ``val_acc`` for a classifier); with ``save_top_k > 1`` the top-k files keep
    Lightning's metric names and ``best.ckpt`` is a copy of the best of them. A non-finite metric never
    makes a checkpoint "best". Without a monitor, ``best.ckpt`` is the latest;
  - a run into a folder that already has them overwrites ``last.ckpt``/``best.ckpt`` (no ``last-v1.ckpt``),
    so the paths in the README and the recipes never go stale;
  - every file (or distributed checkpoint folder) is written under a temporary name in the same folder and
    renamed (``os.replace``), so a crash never leaves a truncated checkpoint; a failed write (disk full,
    read-only folder) removes its temporary file and stops the run with one line saying why
    (:class:`~mmte.errors.RunError`), leaving the previous checkpoint intact.

  What goes *into* the checkpoint (trainable part only, plus the frozen part's source) is decided by
  :class:`mmte.training.module.MMTEModule`.
* :class:`PredictionWriter` gathers ``predict_step`` outputs (across data-parallel ranks, each item
  once, in input order) and writes one row per item (its id columns, per-head prediction, probability /
  value, target when known) to a CSV, Parquet, JSON or NumPy ``.npz`` file, atomically, and prints the
  first rows.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint

from ..errors import RunError

logger = logging.getLogger(__name__)

__all__ = ["MMTECheckpoint", "PredictionWriter", "atomic_write", "atomic_write_with", "batch_columns", "plain_value"]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _write_error(path: str, e: OSError) -> RunError:
    why = e.strerror or str(e)
    code = errno.errorcode.get(e.errno, "") if e.errno else ""
    return RunError(
        f"could not write {path} ({why}{', ' + code if code else ''}); its temporary file was removed and the previous "
        f"{os.path.basename(path)} (if any) is unchanged",
        "expected free disk space and a writable folder",
        "free some space or point --trainer.default_root_dir (or --checkpoint.dirpath) at another folder",
    )


def atomic_write_with(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp)`` for a temporary name in ``path``'s folder, then ``os.replace(tmp, path)``.

    On any failure the temporary file (or folder) is removed; an ``OSError`` becomes a
    :class:`~mmte.errors.RunError` saying why in one line."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}-", dir=folder)
        os.close(fd)
    except OSError as e:
        raise _write_error(path, e) from e
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise _write_error(path, e) from e
    except BaseException:
        _remove(tmp)
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())

    atomic_write_with(path, write)


class MMTECheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` writing ``best.ckpt`` and ``last.ckpt`` atomically (see the module docstring).

    Args:
        monitor: a logged metric, ``"auto"`` (the module's ``primary_metric``), or None (no ranking: ``best.ckpt``
            is the latest).
        mode: ``"min"``/``"max"``; ignored with ``monitor="auto"``.
        save_last: keep ``last.ckpt``, the latest step (what ``--ckpt_path last`` resumes from).
        save_top_k: checkpoints ranked by the monitor to keep; with 1 (the default) it is ``best.ckpt``.
        filename: name template of the ranked checkpoints; default ``best`` with ``save_top_k=1``, else
            ``{epoch}-{step}-{<monitor>:.4f}`` (then ``best.ckpt`` is a copy of the best of them).
        enable_version_counter: False (default): a file of the same name is overwritten, never versioned.
        **kwargs: other ``ModelCheckpoint`` options (dirpath, every_n_epochs, every_n_train_steps, ...).
    """

    BEST = "best"

    def __init__(self, monitor: str | None = "auto", mode: str = "min", save_last: bool | None = True, save_top_k: int = 1,
                 filename: str | None = None, enable_version_counter: bool = False, **kwargs: Any):
        self._auto = monitor == "auto"
        if filename is None and save_top_k == 1:
            filename = self.BEST
        # "auto" stays a placeholder name until setup() knows the module's primary metric
        super().__init__(monitor=monitor, mode=mode, save_last=save_last, save_top_k=save_top_k, filename=filename,
                         enable_version_counter=enable_version_counter, **kwargs)
        self._last_saved_step = -1
        self._nonfinite_warned = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._auto:
            name, mode = getattr(pl_module, "primary_metric", ("val_loss", "min"))
            if mode not in ("min", "max"):
                raise ValueError(f"primary_metric mode must be 'min' or 'max'; got {mode!r}")
            self.monitor, self.mode = name, mode
            self.kth_value = torch.tensor(torch.inf if mode == "min" else -torch.inf)
            if self.filename is None:
                self.filename = "{epoch}-{step}-{" + name + ":.4f}"
            self._auto = False
        super().setup(trainer, pl_module, stage)

    # ---------------------------------------------------------------------------- names
    def _last_path(self) -> str:
        return os.path.join(self.dirpath or "", self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)

    def _best_alias(self) -> str:
        return os.path.join(self.dirpath or "", self.BEST + self.FILE_EXTENSION)

    # ------------------------------------------------------------------- when to save last
    def _save_last_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        """Always ``last.ckpt`` (never ``last-v1.ckpt``), rewritten in place."""
        if not self.save_last:
            return
        self.last_model_path = self._last_path()  # set before saving: it is part of the saved state
        self._save_checkpoint(trainer, self.last_model_path)
        self._last_saved_step = trainer.global_step

    def _ensure_last(self, trainer: Trainer) -> None:
        if self.save_last and self._last_saved_step != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        due = not self._should_skip_saving_checkpoint(trainer) and self._should_save_on_train_epoch_end(trainer)
        super().on_train_epoch_end(trainer, pl_module)
        if due:  # Lightning refreshes last only when a top-k save happened
            self._ensure_last(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        due = not self._should_skip_saving_checkpoint(trainer) and not self._should_save_on_train_epoch_end(trainer)
        super().on_validation_end(trainer, pl_module)
        if due:
            self._ensure_last(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.fast_dev_run and trainer.global_step > 0:
            self._ensure_last(trainer)  # e.g. max_steps ended mid-epoch

    def save_last_now(self, trainer: Trainer) -> str:
        """Write ``last.ckpt`` for the current step unless it was just written (used on SIGINT/SIGTERM)."""
        path = self._last_path()
        if self._last_saved_step != trainer.global_step or not os.path.exists(path):
            self.last_model_path = path
            self._save_checkpoint(trainer, path)
            self._last_saved_step = trainer.global_step
        return path

    # ------------------------------------------------------------------------- best
    def _save_monitor_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        current = monitor_candidates.get(self.monitor) if self.monitor else None
        if isinstance(current, torch.Tensor) and not bool(torch.isfinite(current).all()):
            if not self._nonfinite_warned:
                logger.warning("%s is %s at step %d: not ranked, never saved as best", self.monitor, current.item(), trainer.global_step)
                self._nonfinite_warned = True
            return
        super()._save_monitor_checkpoint(trainer, monitor_candidates)
        self._refresh_best_alias(trainer)

    def _save_none_monitor_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        super()._save_none_monitor_checkpoint(trainer, monitor_candidates)
        self._refresh_best_alias(trainer)

    def _refresh_best_alias(self, trainer: Trainer) -> None:
        """With ranked file names (save_top_k > 1), keep ``best.ckpt`` a copy of the best one."""
        best, alias = self.best_model_path, self._best_alias()
        if not best or os.path.abspath(best) == os.path.abspath(alias) or not trainer.is_global_zero or not os.path.exists(best):
            return

        def copy(tmp: str) -> None:
            if os.path.isdir(best):
                os.unlink(tmp)
                shutil.copytree(best, tmp)
            else:
                shutil.copyfile(best, tmp)

        atomic_write_with(alias, copy)

    # ----------------------------------------------------------------------- writing
    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        folder = os.path.dirname(os.path.abspath(filepath))
        tmp = os.path.join(folder, f".tmp-{os.path.basename(filepath)}")
        try:
            os.makedirs(folder, exist_ok=True)
            if trainer.is_global_zero and os.path.lexists(tmp):
                _remove(tmp)  # left by a killed run
            trainer.strategy.barrier("mmte_checkpoint_tmp")
            trainer.save_checkpoint(tmp, self.save_weights_only)
            trainer.strategy.barrier("mmte_checkpoint_written")  # every rank's shard is in place
            if trainer.is_global_zero and os.path.exists(tmp):
                if os.path.isdir(tmp) and os.path.isdir(filepath):
                    # a distributed (sharded) checkpoint is a folder: swap folders, then drop the old one
                    old = os.path.join(folder, f".old-{os.path.basename(filepath)}")
                    if os.path.exists(old):
                        shutil.rmtree(old)
                    os.replace(filepath, old)
                    os.replace(tmp, filepath)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    if os.path.isdir(filepath) and not os.path.isdir(tmp):
                        shutil.rmtree(filepath)  # a file replaces an old sharded folder of the same name
                    os.replace(tmp, filepath)
        except OSError as e:
            if trainer.is_global_zero:
                _remove(tmp)
            raise _write_error(filepath, e) from e
        except BaseException:
            if trainer.is_global_zero:
                _remove(tmp)
            raise
        trainer.strategy.barrier("mmte_checkpoint_rename")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            from weakref import proxy

            for lg in trainer.loggers:
                lg.after_save_checkpoint(proxy(self))


def _numpy(v: Any) -> np.ndarray:
    return v.detach().float().cpu().numpy() if isinstance(v, torch.Tensor) and v.is_floating_point() else (
        v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))


def batch_columns(out: Mapping[str, Any]) -> tuple[np.ndarray | None, dict[str, np.ndarray], int]:
    """One ``predict_step`` output -> ``(positions [B] or None, {column: array [B, ...]}, B)``; columns are
    ``{head}/{kind}`` (kind: pred, prob, value, target or an embedding's modality)."""
    index = out.get("index")
    cols: dict[str, np.ndarray] = {}
    for h, o in out.items():
        if h == "index" or not isinstance(o, Mapping):
            continue
        for k, v in o.items():
            a = _numpy(v)
            if k == "prob":
                a = a.max(-1)  # the predicted class's probability
            cols[f"{h}/{k}"] = a
    n = next((len(a) for a in cols.values() if a.ndim > 0), 0)
    return (None if index is None else _numpy(index).astype(np.int64).reshape(-1)), cols, n


class PredictionWriter(BasePredictionWriter):
    """Write ``mmte predict`` results to a file users can open, one row per item, and print the first rows.

    Each row carries the item's id columns from the DataModule (``id``: the file name, table row id, or a
    forecast window's start time; plus e.g. ``path`` or ``forecast_start``), then per head the prediction
    (``pred`` class name and ``prob``; or ``value``) and the ``target`` when the data has one (empty where
    unknown). Rows are in the split's order. Under data parallelism each rank predicts its shard; the rows
    are gathered to rank 0 (``all_gather_object``), duplicates from padded samplers dropped, and every
    item is written exactly once.

    Formats: ``.csv`` (scalar predictions), ``.parquet`` (any; arrays as nested lists), ``.json`` (a list
    of row objects), ``.npz`` (one NumPy array per column: forecasts ``value [N, horizon, C]``). A forecast
    or an embedding is an array per item and does not fit a CSV cell: the default output is then
    ``predictions.npz``.

    Args:
        output: the file to write (.csv, .parquet, .json or .npz); None: predictions.csv in the run's log folder (predictions.npz for array predictions such as forecasts).
        print_rows: rows printed to stdout (0: none).
    """

    FORMATS = (".csv", ".parquet", ".json", ".npz")

    def __init__(self, output: str | None = None, print_rows: int = 10):
        super().__init__("batch")  # Lightning's prediction writer: each batch's outputs, then on_predict_end
        if output is not None and not str(output).endswith(self.FORMATS):
            raise ValueError(f"prediction output must end in {', '.join(self.FORMATS)}; got {output!r}")
        if not isinstance(print_rows, int) or print_rows < 0:
            raise ValueError(f"print_rows must be an int >= 0; got {print_rows!r}")
        self.output, self.print_rows = output, print_rows
        self._parts: list[tuple[np.ndarray | None, dict[str, np.ndarray], int]] = []
        self.table: dict[str, Any] = {}
        self.path: str | None = None

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._parts = []
        self.table = {}

    def write_on_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, prediction: Any, batch_indices: Any, batch: Any, batch_idx: int, dataloader_idx: int
    ) -> None:
        if isinstance(prediction, Mapping):
            self._parts.append(batch_columns(prediction))

    # ---------------------------------------------------------------------------------- gather
    def _local(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        pos, cols, seen = [], {}, 0
        for index, c, n in self._parts:
            pos.append(index if index is not None else np.arange(seen, seen + n))
            seen += n
            for k, a in c.items():
                cols.setdefault(k, []).append(a)
        positions = np.concatenate(pos) if pos else np.zeros(0, np.int64)
        return positions, {k: np.concatenate(v) for k, v in cols.items()}

    def _gathered(self, trainer: Trainer) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
        """All ranks' rows on rank 0 in item order, each item once (None on other ranks)."""
        positions, cols = self._local()
        world = getattr(trainer, "world_size", 1)
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            if any(index is None for index, _, _ in self._parts):
                raise ValueError("distributed predict needs each batch's 'index' (item positions) to merge the ranks' rows; the DataModule gives none")
            parts: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(parts, (positions, cols))
            if not trainer.is_global_zero:
                return None
            positions = np.concatenate([p for p, _ in parts])
            keys = list(parts[0][1])
            cols = {k: np.concatenate([c[k] for _, c in parts if k in c]) for k in keys}
        elif not trainer.is_global_zero:
            return None
        order = np.argsort(positions, kind="stable")
        positions = positions[order]
        first = np.ones(len(positions), dtype=bool)
        first[1:] = positions[1:] != positions[:-1]  # a padded sampler repeats items: keep each once
        keep = order[first]
        return positions[first], {k: v[keep] for k, v in cols.items()}

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under distributed strategies: every rank asks, before rank 0 writes
        got = self._gathered(trainer)
        if got is None:
            return
        positions, cols = got
        dm = trainer.datamodule
        ids: dict[str, list[Any]] = {}
        if dm is not None and hasattr(dm, "row_columns"):
            ids = dm.row_columns("predict")
            n = len(next(iter(ids.values()))) if ids else len(positions)
            lim = trainer.limit_predict_batches  # an int counts batches, a float is a fraction (1.0: all)
            limited = lim is not None and not (isinstance(lim, float) and lim >= 1.0)
            if not limited and (len(positions) != n or (n and (positions[0] != 0 or positions[-1] != n - 1))):
                lost = sorted(set(range(n)) - set(positions.tolist()))
                raise ValueError(f"predictions cover {len(positions)} of {n} items (missing positions {lost[:8]}); every item must be predicted once")
            ids = {k: [v[i] for i in positions] for k, v in ids.items()}
        else:
            ids = {"id": positions.tolist()}
        self.table = self.assemble(ids, cols, getattr(dm, "class_names", None))
        arrays = [k for k, v in self.table.items() if isinstance(v, np.ndarray) and v.ndim > 1]
        path = self.output or os.path.join(log_dir or trainer.default_root_dir, "predictions.npz" if arrays else "predictions.csv")
        self._write(path, arrays)
        self.path = path
        if self.print_rows:
            self._print(path, arrays)

    # --------------------------------------------------------------------------------- columns
    @staticmethod
    def assemble(ids: Mapping[str, list[Any]], cols: Mapping[str, np.ndarray], class_names: list[str] | None) -> dict[str, Any]:
        """The file's columns: ``ids``, then per head (prefixed ``<head>_`` when there are several) class names
        for ``pred``/``target``, ``prob`` rounded to 6 digits, other values as float32 (``mmte serve``'s rows too)."""
        heads = list(dict.fromkeys(k.split("/")[0] for k in cols))
        table: dict[str, Any] = dict(ids)
        for h in heads:
            prefix = f"{h}_" if len(heads) > 1 else ""
            mine = {k.split("/", 1)[1]: v for k, v in cols.items() if k.split("/")[0] == h}
            classify = "pred" in mine
            for kind, a in mine.items():
                if kind in ("pred", "target") and classify:
                    a = a.reshape(-1).astype(np.int64)
                    names = class_names or []
                    table[prefix + kind] = [names[int(c)] if 0 <= c < len(names) else ("" if c < 0 else int(c)) for c in a]
                elif kind == "prob":
                    table[prefix + kind] = np.round(a.reshape(-1).astype(np.float64), 6)
                else:
                    a = a.astype(np.float32) if a.dtype.kind == "f" else a
                    table[prefix + kind] = a.reshape(len(a)) if a.ndim > 1 and int(np.prod(a.shape[1:])) == 1 else a
        return table

    def _write(self, path: str, arrays: list[str]) -> None:
        if path.endswith(".npz"):
            buf = io.BytesIO()
            np.savez(buf, **{k: _array(v) for k, v in self.table.items()})
            atomic_write(path, buf.getvalue())
            return
        if arrays and path.endswith(".csv"):
            shape = tuple(self.table[arrays[0]].shape[1:])
            raise ValueError(
                f"predictions {arrays} are arrays of shape {shape} per item and do not fit CSV cells; write them to "
                f"--prediction_writer.output predictions.npz (or .parquet / .json)"
            )
        n = len(next(iter(self.table.values())))
        if path.endswith(".json"):
            rows = [{k: plain_value(v[i]) for k, v in self.table.items()} for i in range(n)]
            atomic_write(path, json.dumps(rows, indent=1))
            return
        import pandas as pd

        frame = pd.DataFrame({k: (list(v.tolist()) if isinstance(v, np.ndarray) and v.ndim > 1 else v) for k, v in self.table.items()})
        if path.endswith(".parquet"):
            buf = io.BytesIO()
            frame.to_parquet(buf, index=False)
            atomic_write(path, buf.getvalue())
        else:
            atomic_write(path, frame.to_csv(index=False))

    def _print(self, path: str, arrays: list[str]) -> None:
        n = len(next(iter(self.table.values()))) if self.table else 0
        print(f"predictions ({n} rows) -> {path}")
        for i in range(min(n, self.print_rows)):
            print("  " + ", ".join(f"{k}={_short(v[i])}" for k, v in self.table.items()))
        for k, v in self.table.items():
            if k.endswith("pred") and k[:-4] + "target" in self.table:
                t = self.table[k[:-4] + "target"]
                known = [i for i in range(n) if t[i] != ""]
                if known:
                    acc = sum(v[i] == t[i] for i in known) / len(known)
                    print(f"  accuracy vs. target ({k[:-5] or 'all'}, {len(known)} rows with a target): {acc:.4f}")
            if k.endswith("value") and k[:-5] + "target" in self.table:
                err = np.asarray(v, np.float64) - np.asarray(self.table[k[:-5] + "target"], np.float64)
                if np.isfinite(err).any():
                    print(f"  vs. target: MSE {np.nanmean(err ** 2):.4f}, MAE {np.nanmean(np.abs(err)):.4f} (over known values)")


def _array(v: Any) -> np.ndarray:
    """A column as a NumPy array without pickled objects: numbers stay numbers, anything else is text."""
    a = np.asarray(v)
    return a.astype(str) if a.dtype == object else a


def plain_value(v: Any) -> Any:
    """One table cell as a JSON value: arrays as lists, NumPy scalars as Python ones, a non-finite float as None."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray) and v.ndim > 0:
        flat = v.reshape(-1)
        return f"[{' x '.join(map(str, v.shape))}: " + ", ".join(f"{x:.3g}" for x in flat[:3]) + (", ...]" if flat.size > 3 else "]")
    if isinstance(v, np.generic):
        v = v.item()
    return f"{v:.4g}" if isinstance(v, float) else str(v)
