"""Multi-step forecasting windows over CSV time series (ETTh1 and the like) as a DataModule."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ...data import datasets as mds
from ...data.normalize import channel_moments
from ...data.seasonal import cycle_rows, fit_level, level_at
from .base import MMTEDataModule

logger = logging.getLogger(__name__)

__all__ = ["ForecastDataModule"]


class ForecastDataModule(MMTEDataModule):
    """Multi-step forecasting windows over CSVs of numeric columns (ETTh1 and the like).

    The training series (``train`` or ``path``) is split chronologically by the dataset's own convention
    when it is known (ETT files: 12/4/4 months, hourly or 15-minute rows read from the timestamps), else
    by ``fractions`` (:func:`mmte.data.time_series.split_borders`), or by explicit ``borders``. It is
    standardised by the training rows' mean and std (saved with the model and reused for every other
    file) and cut into (``input_len``, ``horizon``) windows; validation and test windows start
    ``input_len`` rows before their border (the usual convention), one every ``eval_step`` rows (1: every
    window, as in the literature). A ``val``/``test`` file is windowed whole; a ``predict`` file also gets
    its final window, whose future lies beyond the file (target NaN there).
    Batches: ``{"time_series": [B, input_len, C], "target": [B, horizon, C]}`` (standardised scale).

    Args:
        path: the training series CSV (same as train).
        input_len: input window length (rows).
        horizon: forecast length (rows).
        columns: the series' columns (None: all but time_column).
        time_column: the timestamp column (its spacing tells hourly from 15-minute ETT files; window start times in predictions); null: none.
        train: the training series CSV (default: path); val/test without their own file are cut from it.
        val: a validation CSV, windowed whole with the training scaler.
        test: a test CSV for mmte test, windowed whole (every eval_step-th window) with the training scaler.
        predict: a CSV to forecast from for mmte predict: every eval_step-th window and the final one (beyond the file's end).
        split: ``auto`` (ETT's 12/4/4-month convention for ETT files, else fractions), ``ett``, or ``fractions``.
        fractions: [train, val, test] fractions of the rows for split: fractions (literature: 0.7, 0.1, 0.2; [1, 0, 0]: train on every row).
        borders: explicit [train_start, val_start, test_start, end] rows, overriding split.
        train_step: stride between training windows.
        eval_step: stride between validation/test/predict windows (1: every window, the literature protocol).
        cycle: a fixed seasonal cycle the model takes out of its inputs and adds back to its forecasts: a
            duration (``1D``, ``24h``, ``7D``; pandas offsets) or a number of rows. Its level, each
            channel's mean standardised value at each phase of the cycle over the training rows, is saved
            with the model. Each window carries the level at its input and forecast steps (placed by the
            timestamps, so every file needs ``time_column``); the model forecasts what the cycle does not
            explain, and targets, metrics and predictions stay on the plain standardised scale. None: no cycle.
        **kwargs: :class:`MMTEDataModule` options.
    """

    _source_kinds = "file"

    def __init__(
        self,
        path: str | None = None,
        input_len: int = 96,
        horizon: int = 24,
        columns: list[str] | None = None,
        time_column: str | None = "date",
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        predict: str | None = None,
        split: str = "auto",
        fractions: list[float] | None = None,
        borders: list[int] | None = None,
        train_step: int = 1,
        eval_step: int = 1,
        cycle: int | str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        for name, v in (("input_len", input_len), ("horizon", horizon), ("train_step", train_step), ("eval_step", eval_step)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int; got {v!r}")
        if split not in ("auto", "ett", "fractions"):
            raise ValueError(f"split must be 'auto', 'ett' or 'fractions'; got {split!r}")
        self.path, self.input_len, self.horizon, self.columns_opt = path, input_len, horizon, columns
        self.time_column, self.split, self.fractions = time_column, split, list(fractions or (0.7, 0.1, 0.2))
        self.borders_opt, self.train_step, self.eval_step = borders, train_step, eval_step
        if cycle is not None and (isinstance(cycle, bool) or not isinstance(cycle, (int, str)) or (isinstance(cycle, int) and cycle < 2)):
            raise ValueError(f"cycle must be a duration such as '1D' or '24h', a number of rows >= 2, or null; got {cycle!r}")
        self.cycle_opt = cycle
        self.sources = {"train": train if train is not None else path, "val": val, "test": test, "predict": predict}
        self._series: dict[str, tuple[np.ndarray, list[str], np.ndarray | None]] = {}
        self.borders: list[int] | None = None
        if self.state_from is None:
            if self.sources["train"] is None:
                raise ValueError("ForecastDataModule needs a training series: set path or train (a CSV file)")
            self._borders()
        for s in ("val", "test", "predict"):
            if self.sources[s] is not None and self.state_from is None:
                self._read(s)
        self._init_state()

    def _read(self, split: str) -> tuple[np.ndarray, list[str], np.ndarray | None]:
        from ...data.time_series import read_series

        src = self.sources[split]
        if src is None:
            raise ValueError(self.empty_message(split))
        if src not in self._series:
            option = "path" if split == "train" and self.path is not None else split
            cols = self.columns_opt if split == "train" or self.data_state is None else self.data_state["columns"]
            self._series[src] = read_series(src, cols, self.time_column, option)
        return self._series[src]

    def _borders(self) -> list[int]:
        from ...data.time_series import split_borders

        if self.borders is not None:
            return self.borders
        values, cols, stamps = self._read("train")
        n = len(values)
        where = f"{os.fspath(self.sources['train'])!r}"
        if self.borders_opt is not None:
            b = list(self.borders_opt)
            if len(b) != 4 or b != sorted(b) or b[-1] > n or b[0] < 0:
                raise ValueError(f"borders must be 4 increasing row numbers <= {n} (train, val, test starts and end); got {b}")
            desc = f"borders {b}"
        else:
            b, desc = split_borders(n, cols, stamps, self.split, self.fractions, where)
        logger.info("%s: %s", where, desc)
        if b[1] - b[0] < self.input_len + self.horizon:
            raise ValueError(
                f"the training part of {where} (rows {b[0]}-{b[1] - 1}, {b[1] - b[0]} rows) is shorter than input_len + horizon = "
                f"{self.input_len + self.horizon}; use a longer file, other fractions/borders, or a shorter window"
            )
        self.borders = b
        return b

    # ---------------------------------------------------------------------------------- state
    def fit_state(self) -> dict[str, Any]:
        values, cols, stamps = self._read("train")
        b = self._borders()
        train = values[b[0] : b[1]].astype(np.float64)
        mean, std = channel_moments(train)
        state = {"columns": cols, "mean": mean.tolist(), "std": std.tolist(), "input_len": self.input_len, "horizon": self.horizon}
        if self.cycle_opt is not None:
            state["cycle"] = self._fit_cycle((train - mean) / std, stamps[b[0] : b[1]] if stamps is not None else None)
        return state

    def _fit_cycle(self, z: np.ndarray, stamps: np.ndarray | None) -> dict[str, Any]:
        """The training rows' mean standardised value per phase of the cycle, per channel."""
        from ...data.time_series import row_spacing

        where = f"{os.fspath(self.sources['train'])!r}"
        if stamps is None:
            raise ValueError(f"cycle {self.cycle_opt!r} needs timestamps to place rows in the cycle, and {where} has no time_column {self.time_column!r}; set time_column or cycle: null")
        step = int(row_spacing(stamps).astype("timedelta64[s]").astype(np.int64))
        period = self._cycle_rows(step, where)
        level = fit_level(z, stamps, step, period, where)
        return {"period": period, "step_s": step, "level": level.tolist()}

    def _cycle_rows(self, step: int, where: str) -> int:
        """The ``cycle`` option in rows ``step`` seconds apart."""
        return cycle_rows(self.cycle_opt, step, where)

    def apply_state(self, state: Mapping[str, Any]) -> None:
        for key in ("input_len", "horizon"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the checkpoint's model was trained with {key} {state[key]}; this run has {getattr(self, key)}; "
                    f"drop the override (or set data.init_args.{key}: {state[key]})"
                )
        self.columns = list(state["columns"])
        self.mean, self.std = np.asarray(state["mean"], np.float64), np.asarray(state["std"], np.float64)
        self.cycle = state.get("cycle")
        same = (self.cycle is None) == (self.cycle_opt is None)
        if same and self.cycle is not None:
            same = self._cycle_rows(self.cycle["step_s"], f"{os.fspath(self.sources['train'])!r}") == self.cycle["period"]
        if not same:
            had = f"cycle {self.cycle['period']} rows" if self.cycle else "no cycle"
            raise ValueError(f"the checkpoint's model was trained with {had}; this run has cycle {self.cycle_opt!r}; set data.init_args.cycle as it was trained")
        self.datasets.clear()

    def _season(self, times: np.ndarray | None, where: str) -> np.ndarray:
        """The saved cycle's level ``[len(times), C]`` at those times."""
        if times is None:
            raise ValueError(f"{where!r} has no time_column {self.time_column!r}; the model removes a cycle, which needs each row's timestamp")
        return level_at(self.cycle["level"], times, self.cycle["step_s"], self.cycle["period"])

    @property
    def model_info(self) -> dict[str, Any]:
        return {"tokenizers": {"time_series": {"num_channels": len(self.columns)}}, "horizon": self.horizon, "input_len": self.input_len}

    def _carve_hint(self, split: str) -> str:
        return ", or set split / fractions / borders to cut it from the training series"

    # ---------------------------------------------------------------------------------- build
    def build_split(self, split: str) -> None:
        from ...data.time_series import collate_series, row_spacing

        L, H = self.input_len, self.horizon
        own = split != "train" and self.sources[split] is not None
        src_split = split if own else "train"
        values, cols, stamps = self._read(src_split)
        if own:
            missing = [c for c in self.columns if c not in cols]
            if missing:
                raise ValueError(f"{split} file {self.sources[split]!r} lacks column(s) {missing} the model was trained on; it has {cols}")
            values = values[:, [cols.index(c) for c in self.columns]]
        elif cols != self.columns:
            raise ValueError(f"the training series' columns {cols} differ from the checkpoint's {self.columns}")
        n = len(values)
        if own:
            lo, hi, step = 0, n, self.eval_step
        else:
            b = self._borders()
            lo, hi, step = {"train": (b[0], b[1], self.train_step), "val": (b[1] - L, b[2], self.eval_step), "test": (b[2] - L, b[3], self.eval_step)}[split]
        lo = max(lo, 0)
        if split == "predict":
            starts = list(range(lo, hi - L + 1, step))
            if starts and starts[-1] != hi - L:
                starts.append(hi - L)
        else:
            starts = list(range(lo, hi - L - H + 1, step))
        z = ((values - self.mean) / self.std).astype(np.float32)
        series = torch.from_numpy(np.concatenate([z, np.full((H, z.shape[1]), np.nan, np.float32)]))  # NaN future beyond the end
        self.collates = {"time_series": collate_series}
        ds = mds.arrays_dataset(np.asarray(starts, dtype=np.int64), None, "start").add_column("index", list(range(len(starts))))

        where = self.sources[src_split]
        times = None  # each row's time, then H more past the end at the file's spacing (forecasts beyond it)
        if stamps is not None:
            spacing, last = row_spacing(stamps), np.datetime64(stamps[-1], "s")
            after = last + spacing * np.arange(1, H + 1) if spacing is not None else np.full(H, last)  # one row: no window anyway
            times = np.concatenate([stamps.astype("datetime64[s]"), after])

        def window(t, series=series):
            return series[int(t) : int(t) + L]

        if self.cycle is not None:  # each window with the cycle's level at its input and forecast steps
            level = torch.from_numpy(self._season(times, where).astype(np.float32))

            def window(t, series=series, level=level):
                return {"series": series[int(t) : int(t) + L], "season": level[int(t) : int(t) + L + H]}

        def future(t, series=series):
            return series[int(t) + L : int(t) + L + H]

        self.datasets[split] = mds.lazy_preprocess(ds, {"time_series": ("start", window), "target": ("start", future)}, ("index",))
        if times is not None:

            def stamp(r: int) -> str:
                return str(np.datetime_as_string(times[r]))

            self.names[split] = [stamp(t) for t in starts]
            self.row_info[split] = {"start_row": starts, "forecast_start": [stamp(t + L) for t in starts]}
        else:
            self.names[split] = [f"row {t}" for t in starts]
            self.row_info[split] = {"start_row": starts, "forecast_start_row": [t + L for t in starts]}
        if not starts:
            self._why_empty[split] = (
                f"{where!r} rows {lo}-{hi - 1} hold no window of input_len + horizon = {L + H} rows" if own or split == "train"
                else f"the {split} part of {where!r} (rows {lo}-{hi - 1}) holds no window of input_len + horizon = {L + H} rows"
            )
