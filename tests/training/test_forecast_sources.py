"""Forecasting splits by the dataset's convention (ETTh / ETTm from the timestamps' spacing, never from the
row count) or by the literature's fractions, never a silent truncation; the training scaler reused on
other files; predict windows including the final forecast beyond the file's end."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from mmte.data.time_series import ETT_COLUMNS, ETT_HOURLY_BORDERS, ETT_MINUTE_BORDERS, split_borders
from mmte.training.data import ForecastDataModule


def _frame(n: int, freq: str, columns=ETT_COLUMNS, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    data = {"date": pd.date_range("2016-07-01", periods=n, freq=freq).astype(str)}
    for k, c in enumerate(columns):
        data[c] = np.sin(np.arange(n) / (5 + k)) * (k + 1) + rng.normal(0, 0.1, n) + k
    return pd.DataFrame(data)


def test_split_borders_from_spacing_not_row_count():
    n = 20 * 30 * 24 * 4 + 100  # long enough for ETTm, and far more than ETTh needs
    hourly = pd.date_range("2016-07-01", periods=n, freq="h").to_numpy()
    quarter = pd.date_range("2016-07-01", periods=n, freq="15min").to_numpy()
    b, desc = split_borders(n, ETT_COLUMNS, hourly)
    assert b == list(ETT_HOURLY_BORDERS) == [0, 8640, 11520, 14400]
    assert desc.endswith(f"rows 14400-{n - 1} are not used, as in the literature")
    b, desc = split_borders(n, ETT_COLUMNS, quarter)
    assert b == list(ETT_MINUTE_BORDERS) == [0, 34560, 46080, 57600] and desc.startswith("ETT 15-minute convention")
    with pytest.raises(ValueError) as e:
        split_borders(20000, ETT_COLUMNS, quarter[:20000], where="'ETTm2.csv'")
    assert str(e.value) == ("ETT's 15-minute split convention (12/4/4 months: borders [0, 34560, 46080, 57600]) needs 57600 rows; 'ETTm2.csv' has "
                            "20000; set split: fractions, or borders: [0, train_end, val_end, test_end]")
    daily = pd.date_range("2016-07-01", periods=n, freq="D").to_numpy()
    with pytest.raises(ValueError, match=r"^ETT's split convention needs hourly or 15-minute rows; the series has rows 86400 seconds apart"):
        split_borders(n, ETT_COLUMNS, daily)
    # not an ETT file: the literature's fractions (int(0.7 n) train, int(0.2 n) test, the rest validation)
    b, desc = split_borders(26304, ["a", "b"], hourly[:26304])
    assert b == [0, 18412, 26304 - 5260, 26304] and desc.startswith("fractions [0.7, 0.1, 0.2]")
    assert split_borders(1000, ["a"], None, "fractions", [0.6, 0.2, 0.1])[0] == [0, 600, 800, 900]
    with pytest.raises(ValueError, match=r"^split must be 'auto', 'ett' or 'fractions'; got 'months'$"):
        split_borders(100, ["a"], None, "months")


def test_ettm_file_keeps_its_rows_and_other_files_use_fractions(tmp_path, caplog):
    n = 57600 + 17
    p = tmp_path / "ETTm-like.csv"
    _frame(n, "15min").to_csv(p, index=False)
    with caplog.at_level(logging.INFO, logger="mmte"):
        dm = ForecastDataModule(str(p), input_len=96, horizon=96, batch_size=8)
    assert dm.borders == [0, 34560, 46080, 57600]
    assert "ETT 15-minute convention" in caplog.text and f"rows 57600-{n - 1} are not used" in caplog.text
    dm.setup()
    assert len(dm.datasets["test"]) == 57600 - 46080 - 96 + 1  # every window (eval_step 1)
    q = tmp_path / "sensor.csv"
    _frame(5000, "h", columns=("a", "b", "c")).to_csv(q, index=False)
    other = ForecastDataModule(str(q), input_len=24, horizon=12, batch_size=8)
    assert other.borders == [0, 3500, 4000, 5000]


def test_etth1_literature_protocol(shared_data):
    path = shared_data / "ett" / "ETTh1.csv"
    dm = ForecastDataModule(str(path), input_len=96, horizon=96, batch_size=64)
    dm.setup()
    assert dm.borders == [0, 8640, 11520, 14400]
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [8640 - 192 + 1, 2880 - 96 + 1, 2785]
    df = pd.read_csv(path)
    vals = df[list(ETT_COLUMNS)].to_numpy(np.float64)
    z = (vals - vals[:8640].mean(0)) / vals[:8640].std(0)
    last = dm.datasets["test"][2784]
    np.testing.assert_allclose(last["time_series"].numpy(), z[14400 - 192 : 14400 - 96], rtol=0, atol=1e-5)
    np.testing.assert_allclose(last["target"].numpy(), z[14400 - 96 : 14400], rtol=0, atol=1e-5)
    assert dm.row_names("test")[0] == df["date"].iloc[11520 - 96].replace(" ", "T")


def test_other_files_use_the_training_scaler_and_predict_reaches_past_the_end(tmp_path):
    train = _frame(1000, "h", columns=("a", "b"))
    new = _frame(150, "h", columns=("b", "a"), seed=5)  # other column order
    new["a"] += 10.0  # shifted: must still be scaled by the training rows' mean/std
    tr, te = tmp_path / "train.csv", tmp_path / "new.csv"
    train.to_csv(tr, index=False)
    new.to_csv(te, index=False)
    dm = ForecastDataModule(str(tr), input_len=24, horizon=12, test=str(te), predict=str(te), eval_step=5, batch_size=4)
    vals = train[["a", "b"]].to_numpy(np.float64)
    mean, std = vals[:700].mean(0), vals[:700].std(0)
    z = (new[["a", "b"]].to_numpy(np.float64) - mean) / std
    dm.setup("test")
    test = dm.datasets["test"]
    assert len(test) == len(range(0, 150 - 36 + 1, 5))
    np.testing.assert_allclose(test[3]["time_series"].numpy(), z[15:39], rtol=0, atol=1e-5)
    np.testing.assert_allclose(test[3]["target"].numpy(), z[39:51], rtol=0, atol=1e-5)
    dm.setup("predict")
    pred = dm.datasets["predict"]
    starts = dm.row_columns("predict")["start_row"]
    assert starts == [*range(0, 150 - 24 + 1, 5), 126]  # every eval_step-th window, then the final one
    final = pred[len(pred) - 1]
    np.testing.assert_allclose(final["time_series"].numpy(), z[126:150], rtol=0, atol=1e-5)
    assert np.isnan(final["target"].numpy()).all()  # its future lies beyond the file
    cols = dm.row_columns("predict")
    assert cols["id"][-1] == new["date"].iloc[126].replace(" ", "T")
    assert cols["forecast_start"][-1] == (pd.Timestamp(new["date"].iloc[-1]) + pd.Timedelta(hours=1)).isoformat()
    lacking = tmp_path / "lacking.csv"
    new[["date", "a"]].to_csv(lacking, index=False)
    bad = ForecastDataModule(str(tr), input_len=24, horizon=12, test=str(lacking))
    with pytest.raises(ValueError, match=r"^test file '.*lacking\.csv' lacks column\(s\) \['b'\] the model was trained on; it has \['a'\]$"):
        bad.test_dataloader()


def test_short_file_and_horizon_mismatch_are_named(tmp_path):
    p = tmp_path / "short.csv"
    _frame(60, "h", columns=("a",)).to_csv(p, index=False)
    with pytest.raises(ValueError) as e:
        ForecastDataModule(str(p), input_len=48, horizon=24)
    assert str(e.value) == (f"the training part of '{p}' (rows 0-41, 42 rows) is shorter than input_len + horizon = 72; "
                            "use a longer file, other fractions/borders, or a shorter window")
    q = tmp_path / "ok.csv"
    _frame(400, "h", columns=("a",)).to_csv(q, index=False)
    dm = ForecastDataModule(str(q), input_len=24, horizon=12)
    with pytest.raises(ValueError, match=r"^the checkpoint's model was trained with horizon 12; this run has 24; drop the override"):
        ForecastDataModule(str(q), input_len=24, horizon=24).load_state_dict(dm.state_dict())


def test_non_finite_and_huge_values_are_named_by_row_and_column(tmp_path):
    df = _frame(300, "h", columns=("a", "b"))
    df.loc[123, "b"] = np.nan
    p = tmp_path / "gap.csv"
    df.to_csv(p, index=False)
    with pytest.raises(ValueError) as e:
        ForecastDataModule(str(p), input_len=24, horizon=12)
    assert str(e.value) == f"path '{p}' row 123 (line 125), column 'b': the cell is empty; fill or drop such rows (1 cell(s) in all)"
    df.loc[123, "b"] = 1e300
    df.to_csv(p, index=False)
    with pytest.raises(ValueError, match=r"row 123 \(line 125\), column 'b': 1e\+300 is beyond float32's range"):
        ForecastDataModule(str(p), input_len=24, horizon=12)
    df["b"] = df["b"].astype(object)
    df.loc[123, "b"] = "n/a"
    df.to_csv(p, index=False)
    with pytest.raises(ValueError, match=r"row 123 \(line 125\), column 'b': 'n/a' is not a finite number; fill or drop such rows"):
        ForecastDataModule(str(p), input_len=24, horizon=12)
