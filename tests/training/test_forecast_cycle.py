"""ForecastDataModule's ``cycle``: a seasonal level per phase fitted on the training rows (placed by the
timestamps) and saved with the model; each window carries it at its input and forecast steps; the
time-series tokenizer subtracts it from the inputs and the forecasting head adds it back, so targets,
metrics and predictions stay on the plain standardised scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from mmte.heads.heads import ForecastingHead
from mmte.tokenizers.time_series import TimeSeriesTokenizer
from mmte.training.data import ForecastDataModule


def _hourly(n: int, start: str = "2016-07-01 00:00", seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = pd.date_range(start, periods=n, freq="h")
    hour = t.hour.to_numpy()
    return pd.DataFrame({"date": t.astype(str), "a": 3 * np.sin(2 * np.pi * hour / 24) + rng.normal(0, 0.3, n),
                         "b": np.where(hour < 8, 2.0, -1.0) + 0.01 * np.arange(n) + rng.normal(0, 0.3, n)})


def _naive_cycle(df: pd.DataFrame, rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Independent reference: z-score by the training rows, then each hour of day's mean."""
    vals = df[["a", "b"]].to_numpy(np.float64)
    z = (vals - vals[rows].mean(0)) / vals[rows].std(0)
    hour = pd.to_datetime(df["date"]).dt.hour.to_numpy()
    return np.stack([z[rows][hour[rows] == h].mean(0) for h in range(24)]), z, hour


def test_cycle_state_and_windows(tmp_path):
    df = _hourly(1000, start="2016-07-01 05:00")  # the first row is not phase 0
    p = tmp_path / "s.csv"
    df.to_csv(p, index=False)
    kw = {"input_len": 48, "horizon": 24, "time_column": "date", "batch_size": 8, "eval_step": 7}
    dm = ForecastDataModule(str(p), cycle="1D", **kw)
    level, z, hour = _naive_cycle(df, slice(0, 700))
    state = dm.state_dict()
    assert state["cycle"]["period"] == 24 and state["cycle"]["step_s"] == 3600
    np.testing.assert_allclose(np.asarray(state["cycle"]["level"]), level, rtol=0, atol=1e-6)  # values read as float32
    assert np.abs(level).max() > 0.5  # the fixture has a strong daily cycle
    # a number of rows is the same cycle
    assert ForecastDataModule(str(p), cycle=24, **kw).state_dict()["cycle"] == state["cycle"]
    dm.setup("test")
    item = dm.datasets["test"][5]
    t = int(dm.row_info["test"]["start_row"][5])
    np.testing.assert_allclose(item["time_series"]["series"].numpy(), z[t : t + 48], rtol=0, atol=1e-5)  # the plain series
    np.testing.assert_allclose(item["target"].numpy(), z[t + 48 : t + 72], rtol=0, atol=1e-5)  # and plain targets
    np.testing.assert_allclose(item["time_series"]["season"].numpy(), level[hour[t : t + 72]], rtol=0, atol=1e-5)
    batch = next(iter(dm.test_dataloader()))
    assert {k: tuple(v.shape) for k, v in batch["time_series"].items()} == {"series": (8, 48, 2), "season": (8, 72, 2)}


def test_tokenizer_takes_the_cycle_out_and_the_head_puts_it_back():
    torch.manual_seed(0)
    b, L, H, c = 3, 32, 8, 2
    tok = TimeSeriesTokenizer(16, patch_len=8, stride=8, num_channels=c)
    head = ForecastingHead(16, H, num_patches=tok.num_patches(L))
    x, level = torch.randn(b, L, c), torch.randn(b, L + H, c)
    seq = tok(x, level)
    got = head(seq.tokens, seq)  # the tokens stand in for the backbone's output
    ref_seq = tok(x - level[:, :L])
    want = head(ref_seq.tokens, ref_seq) + level[:, L:]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, head(tok(x).tokens, tok(x)), atol=1e-2)  # the cycle changes the forecast
    with pytest.raises(ValueError, match=r"^season must be \[B, L \+ horizon, C\] with B=3, L=32, C=2; got shape \(3, 32, 2\)$"):
        tok(x, level[:, :L])
    with pytest.raises(ValueError, match=r"^season holds NaN/inf; expected finite values$"):
        tok(x, level * float("nan"))
    short = tok(x, level[:, : L + 4])
    with pytest.raises(ValueError, match=r"^the tokenizer's season covers 4 forecast steps of 2 channels; this head forecasts \(8, 2\)$"):
        head(short.tokens, short)


def test_cycle_on_another_file_and_beyond_its_end(tmp_path):
    df = _hourly(800)
    other = _hourly(130, start="2017-03-04 17:00", seed=3)
    tr, new = tmp_path / "train.csv", tmp_path / "new.csv"
    df.to_csv(tr, index=False)
    other.to_csv(new, index=False)
    dm = ForecastDataModule(str(tr), input_len=24, horizon=12, time_column="date", cycle="24h", predict=str(new), batch_size=4)
    level = np.asarray(dm.state_dict()["cycle"]["level"])
    dm.setup("predict")
    ds = dm.datasets["predict"]
    final = ds[len(ds) - 1]  # forecasts past the file's end: 130 - 24 = row 106 starts it
    assert int(dm.row_info["predict"]["start_row"][-1]) == 106
    hours = (17 + np.arange(106, 142)) % 24  # the input rows, then the 12 hours after the file's end
    np.testing.assert_allclose(final["time_series"]["season"].numpy(), level[hours], rtol=0, atol=1e-6)
    assert np.isnan(final["target"].numpy()).all()


def test_cycle_errors_are_named(tmp_path):
    df = _hourly(400)
    p = tmp_path / "s.csv"
    df.to_csv(p, index=False)
    kw = {"input_len": 24, "horizon": 12, "time_column": "date"}
    with pytest.raises(ValueError, match=r"^cycle '90min' is 1\.5 rows of '.*s\.csv''s 3600 s spacing; expected a whole number of rows >= 2$"):
        ForecastDataModule(str(p), cycle="90min", **kw)
    with pytest.raises(ValueError, match=r"^cycle 'daily' is not a duration; expected e\.g\. '1D', '24h', '7D' or a number of rows$"):
        ForecastDataModule(str(p), cycle="daily", **kw)
    for bad in (1, True, 2.5):
        with pytest.raises(ValueError, match=r"^cycle must be a duration such as '1D' or '24h', a number of rows >= 2, or null; got"):
            ForecastDataModule(str(p), cycle=bad, **kw)
    with pytest.raises(ValueError, match=r"do not cover every phase of it; use a shorter cycle or a longer training part$"):
        ForecastDataModule(str(p), cycle="30D", **kw)
    q = tmp_path / "untimed.csv"
    df.drop(columns="date").to_csv(q, index=False)
    with pytest.raises(ValueError, match=r"^cycle '1D' needs timestamps to place rows in the cycle, and '.*untimed\.csv' has no time_column 'date'; set time_column or cycle: null$"):
        ForecastDataModule(str(q), input_len=24, horizon=12, cycle="1D")
    trained = ForecastDataModule(str(p), cycle="1D", **kw).state_dict()
    with pytest.raises(ValueError, match=r"^the checkpoint's model was trained with cycle 24 rows; this run has cycle None; set data\.init_args\.cycle"):
        ForecastDataModule(str(p), **kw).load_state_dict(trained)
    with pytest.raises(ValueError, match=r"^the checkpoint's model was trained with no cycle; this run has cycle '1D'"):
        ForecastDataModule(str(p), cycle="1D", **kw).load_state_dict(ForecastDataModule(str(p), **kw).state_dict())
    with pytest.raises(ValueError, match=r"^the checkpoint's model was trained with cycle 24 rows; this run has cycle '7D'"):
        ForecastDataModule(str(p), cycle="7D", **kw).load_state_dict(trained)
    ForecastDataModule(str(p), cycle="24h", **kw).load_state_dict(trained)  # the same cycle written otherwise
