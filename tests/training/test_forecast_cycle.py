"""ForecastDataModule's ``cycle``: a seasonal profile fitted on the training rows (each channel's mean
standardised value per phase, placed by the timestamps), removed from inputs and targets, saved with the
model, and given back by ``restore`` so errors and predictions are on the plain standardised scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mmte.training.datamodule import ForecastDataModule


def _hourly(n: int, start: str = "2016-07-01 00:00", seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = pd.date_range(start, periods=n, freq="h")
    hour = t.hour.to_numpy()
    return pd.DataFrame({"date": t.astype(str), "a": 3 * np.sin(2 * np.pi * hour / 24) + rng.normal(0, 0.3, n),
                         "b": np.where(hour < 8, 2.0, -1.0) + 0.01 * np.arange(n) + rng.normal(0, 0.3, n)})


def _naive_profile(df: pd.DataFrame, rows: slice) -> np.ndarray:
    """Independent reference: z-score by the training rows, then average by hour of day."""
    vals = df[["a", "b"]].to_numpy(np.float64)
    z = (vals - vals[rows].mean(0)) / vals[rows].std(0)
    hour = pd.to_datetime(df["date"]).dt.hour.to_numpy()
    return np.stack([z[rows][hour[rows] == h].mean(0) for h in range(24)]), z, hour


def test_cycle_profile_windows_and_restore(tmp_path):
    df = _hourly(1000, start="2016-07-01 05:00")  # the first row is not phase 0
    p = tmp_path / "s.csv"
    df.to_csv(p, index=False)
    kw = {"input_len": 48, "horizon": 24, "time_column": "date", "batch_size": 8, "eval_step": 7}
    dm = ForecastDataModule(str(p), cycle="1D", **kw)
    plain = ForecastDataModule(str(p), **kw)
    profile, z, hour = _naive_profile(df, slice(0, 700))
    state = dm.state_dict()
    assert state["cycle"]["period"] == 24 and state["cycle"]["step_s"] == 3600
    np.testing.assert_allclose(np.asarray(state["cycle"]["profile"]), profile, rtol=0, atol=1e-6)  # values read as float32
    assert np.abs(profile).max() > 0.5  # the fixture has a strong daily cycle to remove
    # a number of rows is the same cycle
    np.testing.assert_allclose(ForecastDataModule(str(p), cycle=24, **kw).state_dict()["cycle"]["profile"], state["cycle"]["profile"], atol=0)
    dm.setup("test")
    plain.setup("test")
    item = dm.datasets["test"][5]
    start = int(dm.row_info["test"]["start_row"][5])
    np.testing.assert_allclose(item["time_series"].numpy(), (z - profile[hour])[start : start + 48], rtol=0, atol=1e-5)
    np.testing.assert_allclose(item["target"].numpy(), (z - profile[hour])[start + 48 : start + 72], rtol=0, atol=1e-5)
    # restore gives forecasts and targets the cycle back: the plain windows' targets, errors unchanged
    pos = np.arange(len(dm.datasets["test"]))
    tgt = np.stack([dm.datasets["test"][i]["target"].numpy() for i in pos])
    fake = tgt + 0.25  # a "forecast" off by a constant
    back = dm.restore("test", pos, {"forecast/value": fake, "forecast/target": tgt, "forecast/other": np.zeros((len(pos), 1))})
    want = np.stack([plain.datasets["test"][i]["target"].numpy() for i in pos])
    np.testing.assert_allclose(back["forecast/target"], want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(back["forecast/value"] - back["forecast/target"], 0.25, rtol=0, atol=1e-5)
    assert not back["forecast/other"].any()
    assert plain.restore("test", pos, {"forecast/value": fake})["forecast/value"] is fake  # no cycle: unchanged


def test_cycle_on_another_file_and_beyond_its_end(tmp_path):
    df = _hourly(800)
    other = _hourly(130, start="2017-03-04 17:00", seed=3)
    tr, new = tmp_path / "train.csv", tmp_path / "new.csv"
    df.to_csv(tr, index=False)
    other.to_csv(new, index=False)
    dm = ForecastDataModule(str(tr), input_len=24, horizon=12, time_column="date", cycle="24h", predict=str(new), batch_size=4)
    profile = np.asarray(dm.state_dict()["cycle"]["profile"])
    dm.setup("predict")
    ds = dm.datasets["predict"]
    final = ds[len(ds) - 1]  # forecasts past the file's end: 130 - 24 = row 106 starts it
    assert int(dm.row_info["predict"]["start_row"][-1]) == 106
    vals = df[["a", "b"]].to_numpy(np.float64)[:560]
    z = (other[["a", "b"]].to_numpy(np.float64) - vals.mean(0)) / vals.std(0)
    hours = (17 + np.arange(106, 130)) % 24
    np.testing.assert_allclose(final["time_series"].numpy(), z[106:130] - profile[hours], rtol=0, atol=1e-5)
    back = dm.restore("predict", np.array([len(ds) - 1]), {"f/value": np.zeros((1, 12, 2), np.float32)})["f/value"][0]
    np.testing.assert_allclose(back, profile[(17 + np.arange(130, 142)) % 24], rtol=0, atol=1e-6)  # the hours after the end


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
