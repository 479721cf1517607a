"""TableDataModule and TableSchema: types, scalers and vocabularies from the training split only, reused
unchanged on other files; values that do not fit are errors naming file, row and column (or follow the
documented policy); test/val/predict tables and split columns; quantile scaling against scikit-learn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from mmte.data.tabular import TableSchema, read_frame
from mmte.training.data import TableDataModule


@pytest.fixture(scope="module")
def diamonds(shared_data_module):
    return pd.read_csv(shared_data_module / "tabular" / "diamonds.csv")


@pytest.fixture(scope="module")
def shared_data_module():
    from tests.conftest import SHARED_DATA, need_data

    need_data(SHARED_DATA / "tabular" / "diamonds.csv", "diamonds.csv")
    return SHARED_DATA


def _csv(tmp_path, name, frame):
    p = tmp_path / name
    frame.to_csv(p, index=False)
    return str(p)


def test_schema_from_training_rows_reused_on_a_shuffled_shifted_file(diamonds, tmp_path):
    train = diamonds.sample(300, random_state=0).reset_index(drop=True)
    test = diamonds.sample(40, random_state=1).reset_index(drop=True)
    test["carat"] = test["carat"] * 3 + 1.0  # shifted statistics: must be scaled by the TRAIN mean/std
    test = test[["z", "clarity", "price", "cut", "color", "carat", "depth", "table", "x", "y"]]  # other column and category order
    dm = TableDataModule(_csv(tmp_path, "train.csv", train), label_column="cut", val_fraction=0.0, test=_csv(tmp_path, "test.csv", test))
    assert dm.numeric == ["carat", "depth", "table", "price", "x", "y", "z"] and dm.categorical == ["color", "clarity"]
    assert dm.class_names == sorted(train["cut"].unique())
    dm.setup()
    items = [dm.datasets["test"][i] for i in range(len(test))]
    num = torch.stack([it["tabular"]["numeric"] for it in items]).numpy()
    cat = torch.stack([it["tabular"]["categorical"] for it in items]).numpy()
    for j, c in enumerate(dm.numeric):  # pandas, population std, train rows only
        np.testing.assert_allclose(num[:, j], (test[c] - train[c].mean()) / train[c].std(ddof=0), rtol=1e-5, atol=1e-5)
    for j, c in enumerate(dm.categorical):  # codes = positions in the sorted training vocabulary
        vocab = sorted(train[c].unique())
        np.testing.assert_array_equal(cat[:, j], [vocab.index(v) for v in test[c]])
    labels = [int(it["label"]) for it in items]
    assert labels == [dm.class_names.index(v) for v in test["cut"]]
    assert dm.row_names("test") == [str(i) for i in range(40)]
    assert dm.model_info == {"tokenizers": {"tabular": {"num_numeric": 7, "cardinalities": [7, 8]}}, "num_classes": 5}


def test_stray_string_in_a_numeric_column_names_row_and_column(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.normal(size=40).round(3).astype(str), "c": rng.choice(["u", "v"], 40), "y": rng.choice(["a", "b"], 40)})
    df.loc[17, "x"] = "12,5"
    p = _csv(tmp_path, "t.csv", df)
    with pytest.raises(ValueError) as e:
        TableDataModule(p, label_column="y", val_fraction=0.0)
    assert str(e.value) == ("t.csv row 17 (line 19), column 'x': '12,5' is not a number, but 39 of 40 training values are; fix the value, "
                            "list 'x' under categorical, or set bad_value: missing")
    dm = TableDataModule(p, label_column="y", val_fraction=0.0, bad_value="missing")
    assert dm.numeric == ["x"] and dm.categorical == ["c"]
    dm.setup()
    assert np.isnan(float(dm.datasets["train"][17]["tabular"]["numeric"][0]))  # the stray value is missing (NaN)
    # a string in a numeric column of ANOTHER file: the training split decided the type
    test = df.copy()
    test["x"] = rng.normal(size=40).round(3).astype(str)
    test.loc[3, "x"] = "n/a?"
    dm = TableDataModule(_csv(tmp_path, "train.csv", df.drop(17)), label_column="y", val_fraction=0.0, test=_csv(tmp_path, "test.csv", test))
    with pytest.raises(ValueError) as e:
        dm.test_dataloader()
    assert str(e.value) == ("test test.csv row 3 (line 5), column 'x': 'n/a?' is not a finite number (the column is numeric); "
                            "fix it or set bad_value: missing")


def test_missing_and_nan_labels(tmp_path):
    df = pd.DataFrame({"x": np.arange(12.0), "y": ["a", "b"] * 6})
    df.loc[4, "y"] = ""
    p = _csv(tmp_path, "t.csv", df)
    with pytest.raises(ValueError) as e:
        TableDataModule(p, label_column="y")
    assert str(e.value) == ("train t.csv row 4 (line 6), column 'y': the label is empty or NaN (1 such row(s)); fill it, "
                            "or set missing_label: drop to skip such rows")
    dm = TableDataModule(p, label_column="y", missing_label="drop", val_fraction=0.0)
    assert dm.class_names == ["a", "b"]  # no extra class for the empty label
    dm.setup()
    assert len(dm.datasets["train"]) == 11 and "4" not in dm.row_names("train")
    pq = tmp_path / "t.parquet"
    pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0.0, np.nan, 1.0]}).to_parquet(pq)
    with pytest.raises(ValueError, match=r"^train t\.parquet row 1, column 'y': the label is empty or NaN"):
        TableDataModule(str(pq), label_column="y")


def test_unseen_category_policy(tmp_path):
    train = pd.DataFrame({"x": np.arange(10.0), "c": ["red", "blue"] * 5, "y": ["p", "q"] * 5})
    test = pd.DataFrame({"x": [1.0, 2.0, 3.0], "c": ["blue", "green", "red"], "y": ["p", "q", "p"]})
    tr, te = _csv(tmp_path, "train.csv", train), _csv(tmp_path, "test.csv", test)
    dm = TableDataModule(tr, label_column="y", val_fraction=0.0, test=te)
    dm.setup("test")
    assert [int(dm.datasets["test"][i]["tabular"]["categorical"][0]) for i in range(3)] == [0, -1, 1]  # green: missing
    strict = TableDataModule(tr, label_column="y", val_fraction=0.0, test=te, unknown_category="error")
    with pytest.raises(ValueError) as e:
        strict.test_dataloader()
    assert str(e.value) == ("test test.csv row 1 (line 3), column 'c': category 'green' is not in the training split (known: ['blue', 'red']); "
                            "set unknown_category: missing to encode it as missing")
    bad = TableDataModule(tr, label_column="y", val_fraction=0.0, test=_csv(tmp_path, "t2.csv", test.assign(y=["p", "r", "p"])))
    with pytest.raises(ValueError) as e:
        bad.test_dataloader()
    assert str(e.value) == ("test t2.csv row 1 (line 3), column 'y': label 'r' is not a class of the training split (['p', 'q']); "
                            "remove the row, or train with that class")


def test_split_column_predict_table_and_ids(tmp_path):
    df = pd.DataFrame({"id": [f"r{i}" for i in range(12)], "x": np.arange(12.0), "y": ["a", "b", "c"] * 4,
                       "fold": ["train"] * 8 + ["valid"] * 2 + ["TEST"] * 2})
    dm = TableDataModule(_csv(tmp_path, "t.csv", df), label_column="y", split_column="fold", id_column="id")
    assert dm.numeric == ["x"] and dm.categorical == []  # split and id columns are not features
    dm.setup()
    assert dm.row_names("train") == [f"r{i}" for i in range(8)]
    assert dm.row_names("val") == ["r8", "r9"] and dm.row_names("test") == ["r10", "r11"]
    new = pd.DataFrame({"id": ["n1", "n2"], "x": [100.0, -3.0]})  # no label column: nothing to compare with
    dm2 = TableDataModule(_csv(tmp_path, "t.csv", df), label_column="y", split_column="fold", id_column="id", predict=_csv(tmp_path, "new.csv", new))
    batch = next(iter(dm2.predict_dataloader()))
    assert set(batch) == {"tabular", "index"} and dm2.row_columns("predict") == {"id": ["n1", "n2"], "row": [0, 1]}
    mu, sd = np.mean(np.arange(8.0)), np.std(np.arange(8.0))
    torch.testing.assert_close(batch["tabular"]["numeric"][:, 0], torch.tensor([(100 - mu) / sd, (-3 - mu) / sd], dtype=torch.float32))
    df.loc[5, "fold"] = "holdout"
    with pytest.raises(ValueError, match=r"^t\.csv row 5 \(line 7\), split_column 'fold': 'holdout' is not a split; expected train, val"):
        TableDataModule(_csv(tmp_path, "t.csv", df), label_column="y", split_column="fold")


def test_quantile_scaling_matches_scikit_learn(diamonds):
    from sklearn.preprocessing import QuantileTransformer

    train = diamonds.sample(2000, random_state=0).reset_index(drop=True)
    test = diamonds.sample(500, random_state=2).reset_index(drop=True)
    train["__mmte_file"], train["__mmte_row"] = "train", np.arange(len(train))
    test["__mmte_file"], test["__mmte_row"] = "test", np.arange(len(test))
    cols = ["carat", "price", "depth"]
    schema = TableSchema(scaling="quantile").fit(train, cols)
    num, _ = schema.encode(test)
    ref = QuantileTransformer(n_quantiles=1000, output_distribution="normal", subsample=None).fit(train[cols]).transform(test[cols])
    np.testing.assert_allclose(num, ref, rtol=1e-4, atol=1e-4)
    state = schema.state()
    again = TableSchema.from_state(state)
    np.testing.assert_array_equal(again.encode(test)[0], num)
    assert state["scaling"] == "quantile" and len(state["stats"]["carat"]) == 1000


def test_read_frame_glob_and_header_only(tmp_path):
    for k in range(2):
        pd.DataFrame({"a": [k, k + 1], "y": ["p", "q"]}).to_csv(tmp_path / f"part{k}.csv", index=False)
    f = read_frame(str(tmp_path / "part*.csv"), "test")
    assert f["a"].tolist() == ["0", "1", "1", "2"] and f["__mmte_row"].tolist() == [0, 1, 0, 1]
    (tmp_path / "empty.csv").write_text("a,y\n")
    with pytest.raises(ValueError, match=r"^test '.*empty\.csv' has a header but no rows; expected at least one data row$"):
        read_frame(str(tmp_path / "empty.csv"), "test")
    dm = TableDataModule(str(tmp_path / "part0.csv"), label_column="y", val_fraction=0.0, test=str(tmp_path / "part*.csv"))
    dm.setup("test")
    assert dm.row_names("test") == ["part0.csv:0", "part0.csv:1", "part1.csv:0", "part1.csv:1"]


def test_huge_and_infinite_numbers_are_named(tmp_path):
    train = pd.DataFrame({"x": np.arange(20.0), "y": ["a", "b"] * 10})
    test = pd.DataFrame({"x": [1.0, 1e300, 2.0], "y": ["a", "b", "a"]})
    dm = TableDataModule(_csv(tmp_path, "train.csv", train), label_column="y", val_fraction=0.0, test=_csv(tmp_path, "test.csv", test))
    with pytest.raises(ValueError) as e:
        dm.test_dataloader()
    assert str(e.value) == ("test test.csv row 1 (line 3), column 'x': '1e+300' is beyond float32's range (|x| <= 3.4e38) (the column is numeric); "
                            "fix it or set bad_value: missing")
    pq = tmp_path / "inf.parquet"
    pd.DataFrame({"x": [1.0, 2.0, np.inf, 4.0], "y": ["a", "b", "a", "b"]}).to_parquet(pq)
    with pytest.raises(ValueError, match=r"^inf\.parquet row 2, column 'x': inf is not a finite number; fix it or set bad_value: missing$"):
        TableDataModule(str(pq), label_column="y", numeric=["x"], val_fraction=0.0)


def test_a_missing_label_column_is_named(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("alcohol,ash,cultivar\n13.2,2.1,a\n12.1,2.4,b\n")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['target'\]; it has \['alcohol', 'ash', 'cultivar'\]"):
        TableDataModule(str(p), label_column="target")
