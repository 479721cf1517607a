"""Issue 15's 'Done when', through the real `mmte` command on the shipped recipes: for audio, tabular and
forecasting, train on one folder/file, then test and predict on ANOTHER with one flag each. Asserted:
every item of the new data is scored once (count and ids), the class map / table schema / scaler come from
training (checked against values computed here with pandas from the training data only), test and
predict agree, and an empty split is one line naming the option that fills it."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from mmte.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "encoders" / "tiny.yaml")
# fp32 predictions (predict_dtype auto would take bf16 on CPUs with native bf16), to compare with fp32 references;
# given at fit time too, since --ckpt_path restores the model's hyperparameters
FAST = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--model.predict_dtype", "fp32"]
STEPS = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _metric(root: Path, name: str) -> float:
    vals = []
    for f in sorted(root.glob("logs/version_*/metrics.csv")):
        with open(f) as fh:
            vals += [float(r[name]) for r in csv.DictReader(fh) if r.get(name) not in (None, "")]
    assert vals, f"{name} not logged under {root}"
    return vals[-1]


def _latest(root: Path, name: str) -> Path:
    return max(root.glob(f"logs/version_*/{name}"), key=lambda p: int(p.parent.name.split("_")[1]))


def _error(capsys, args) -> str:
    capsys.readouterr()
    assert main([*args, *FAST]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("mmte: error:")]
    assert len(errors) == 1, errors
    return errors[0]


def test_audio_folder_train_then_test_and_predict_on_another_folder(tmp_path, capsys, shared_data):
    fsdd = shared_data / "fsdd" / "recordings"
    train, other = tmp_path / "train", tmp_path / "other"
    train.mkdir()
    other.mkdir()
    for d in (0, 1, 2):
        for i in range(5, 13):
            (train / f"{d}_jackson_{i}.wav").symlink_to(fsdd / f"{d}_jackson_{i}.wav")
    for d in (1, 2):  # a subset of the classes, another speaker
        for i in range(3):
            (other / f"{d}_theo_{i}.wav").symlink_to(fsdd / f"{d}_theo_{i}.wav")
    root = tmp_path / "run"
    recipe = ["--config", str(ROOT / "recipes" / "fsdd_audio.yaml"), "--config", TINY, "--trainer.default_root_dir", str(root)]
    assert main(["fit", *recipe, "--data.init_args.data_dir", str(train), "--data.init_args.val_regex", r"_5\.wav$", *STEPS, *FAST]) == 0
    ckpt = root / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)["FolderDataModule"]
    assert saved["class_names"] == ["0", "1", "2"]
    # test: the whole other folder, with the training class map (3 classes; the folder has 2)
    assert main(["test", *recipe, "--ckpt_path", str(ckpt), "--data.init_args.test", str(other), *FAST]) == 0
    test_acc = _metric(root, "test_acc")
    # predict: needs neither the training folder nor its labels' full class set
    capsys.readouterr()
    assert main(["predict", *recipe, "--ckpt_path", str(ckpt), "--data.init_args.data_dir", str(tmp_path / "gone"),
                 "--data.init_args.predict", str(other), "--prediction_writer.print_rows", "0", *FAST]) == 0
    with open(_latest(root, "predictions.csv")) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == sorted(p.name for p in other.iterdir())  # each file once, in order
    assert [r["path"] for r in rows] == [str(other / r["id"]) for r in rows]
    assert [r["target"] for r in rows] == [r["id"][0] for r in rows]
    assert {r["pred"] for r in rows} <= {"0", "1", "2"}
    assert sum(r["pred"] == r["target"] for r in rows) / len(rows) == pytest.approx(test_acc, abs=1e-6)
    msg = _error(capsys, ["test", *recipe, "--ckpt_path", str(ckpt), "--data.init_args.data_dir", str(train)])
    assert msg == ("mmte: error: the 'test' split is empty (no test source, test_regex or test_groups is set and test_fraction is 0.0); "
                   "pass --data.init_args.test <folder|file|glob>, or set test_regex / test_groups / test_fraction to carve it out of the training data")


def test_table_train_then_test_and_predict_on_another_file(tmp_path, capsys, shared_data):
    df = pd.read_csv(shared_data / "tabular" / "diamonds.csv")
    train = df.sample(400, random_state=0).reset_index(drop=True)
    val = df.sample(50, random_state=1).reset_index(drop=True)
    test = df.sample(60, random_state=2).reset_index(drop=True)
    test["carat"] = test["carat"] * 2 + 0.5  # shifted statistics
    test = test[["price", "clarity", "z", "cut", "color", "x", "carat", "depth", "table", "y"]]  # another column order
    paths = {}
    for name, frame in (("train", train), ("val", val), ("test", test)):
        paths[name] = str(tmp_path / f"{name}.csv")
        frame.to_csv(paths[name], index=False)
    root = tmp_path / "run"
    recipe = ["--config", str(ROOT / "recipes" / "tabular_wine.yaml"), "--data.init_args.label_column", "cut", "--trainer.default_root_dir", str(root)]
    assert main(["fit", *recipe, "--data.init_args.path", paths["train"], "--data.init_args.val", paths["val"], *STEPS, *FAST]) == 0
    ckpt = root / "checkpoints" / "last.ckpt"
    assert main(["test", *recipe, "--ckpt_path", str(ckpt), "--data.init_args.test", paths["test"], *FAST]) == 0
    test_acc = _metric(root, "test_acc")
    capsys.readouterr()
    assert main(["predict", *recipe, "--ckpt_path", str(ckpt), "--data.init_args.predict", paths["test"], "--prediction_writer.print_rows", "0", *FAST]) == 0
    rows = pd.read_csv(_latest(root, "predictions.csv"), keep_default_na=False)
    assert rows["id"].tolist() == list(range(60)) and rows["target"].tolist() == test["cut"].tolist()
    assert (rows["pred"] == rows["target"]).mean() == pytest.approx(test_acc, abs=1e-6)
    # independent check that nothing was refitted: encode the test file here from the TRAINING file alone
    num_cols, cat_cols = ["carat", "depth", "table", "price", "x", "y", "z"], ["color", "clarity"]
    num = torch.tensor(((test[num_cols] - train[num_cols].mean()) / train[num_cols].std(ddof=0)).to_numpy(), dtype=torch.float32)
    cat = torch.tensor(np.stack([[sorted(train[c].unique()).index(v) for v in test[c]] for c in cat_cols], 1))
    from mmte.training.module import MMTEModule

    classes = sorted(train["cut"].unique())
    model = MMTEModule({"tabular": {"name": "tabular"}}, "tiny", {"cultivar": {"name": "classification", "pool": "cls"}}, freeze="none",
                       data_info={"tokenizers": {"tabular": {"num_numeric": 7, "cardinalities": [7, 8]}}, "num_classes": len(classes)})
    model.configure_model()
    model.load_state_dict(torch.load(ckpt, weights_only=True)["state_dict"])
    model.eval()
    with torch.no_grad():
        prob = model.model({"tabular": {"numeric": num, "categorical": cat}})["cultivar"].softmax(-1)
    assert rows["pred"].tolist() == [classes[i] for i in prob.argmax(-1).tolist()]
    np.testing.assert_allclose(rows["prob"].to_numpy(), prob.max(-1).values.numpy(), rtol=0, atol=1e-5)
    msg = _error(capsys, ["test", *recipe, "--ckpt_path", str(ckpt)])
    assert msg == ("mmte: error: the 'test' split is empty (no test table or split_column is set and test_fraction is 0.0); "
                   "pass --data.init_args.test <file|glob>, or set split_column / test_fraction to take it from the training table")


def test_forecast_train_then_test_and_predict_on_another_file(tmp_path, capsys, shared_data):
    ett = shared_data / "ett" / "ETTh1.csv"
    df = pd.read_csv(ett)
    cols = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    new = df.iloc[14400:14701].copy()
    new["OT"] += 5.0  # shifted: must be scaled with the training months' statistics
    new = new[["date", "OT", *cols[:-1]]]
    new_path = tmp_path / "recent.csv"
    new.to_csv(new_path, index=False)
    root = tmp_path / "run"
    recipe = ["--config", str(ROOT / "recipes" / "etth1_forecast.yaml"), "--config", TINY, "--data.init_args.path", str(ett),
              "--trainer.default_root_dir", str(root)]
    assert main(["fit", *recipe, "--data.init_args.train_step", "16", *STEPS, *FAST]) == 0
    ckpt = root / "checkpoints" / "last.ckpt"
    assert main(["test", *recipe, "--ckpt_path", str(ckpt), "--data.init_args.test", str(new_path), *FAST]) == 0
    test_mse = _metric(root, "test_mse")
    capsys.readouterr()
    assert main(["predict", *recipe, "--ckpt_path", str(ckpt), "--data.init_args.predict", str(new_path), "--prediction_writer.print_rows", "0", *FAST]) == 0
    z = np.load(_latest(root, "predictions.npz"))
    n_win = 301 - 96 + 1  # every window of the file, the last one forecasting beyond its end
    assert z["value"].shape == (n_win, 96, 7) and z["target"].shape == (n_win, 96, 7)
    assert z["id"].tolist() == [d.replace(" ", "T") for d in new["date"].iloc[:n_win]]  # window start times
    assert z["start_row"].tolist() == list(range(n_win))
    train = df[cols].to_numpy(np.float64)[:8640]
    zs = (new[cols].to_numpy(np.float64) - train.mean(0)) / train.std(0)
    np.testing.assert_allclose(z["target"][0], zs[96:192], rtol=0, atol=1e-4)
    assert np.isnan(z["target"][-1]).all() and np.isfinite(z["target"][301 - 192]).all()
    full = slice(0, 301 - 192 + 1)  # the windows mmte test scored (whole future inside the file)
    mse = float(np.mean((z["value"][full].astype(np.float64) - z["target"][full]) ** 2))
    assert mse == pytest.approx(test_mse, rel=1e-4)
    short = tmp_path / "short.csv"
    new.iloc[:100].to_csv(short, index=False)
    msg = _error(capsys, ["test", *recipe, "--ckpt_path", str(ckpt), "--data.init_args.test", str(short)])
    assert msg == (f"mmte: error: the 'test' split is empty ('{short}' rows 0-99 hold no window of input_len + horizon = 192 rows); "
                   "pass --data.init_args.test <file>, or set split / fractions / borders to cut it from the training series")
    assert os.path.isfile(ckpt)


@pytest.mark.parametrize("name", ["FolderDataModule", "TableDataModule", "ForecastDataModule", "ArrayDataModule", "PairedDataModule"])
def test_every_data_option_has_a_description_in_help(name, capsys):
    """`mmte fit --data.help <DataModule>` gives every option a one-line description (from the docstrings)."""
    import re

    assert main(["fit", "--data.help", name]) == 0  # mmte.cli.main returns the exit status
    text = capsys.readouterr().out
    entries = re.split(r"\n(?=  --data\.)", text[text.index("\n  --data.") :])
    described = {}
    for e in filter(str.strip, entries):
        m = re.match(r"\s*(--data\.\w+)(?: [A-Z_]+| \{[^}]*\})?(?:, --data\.\w+\+ [A-Z_]+)?(.*)", e, re.DOTALL)
        assert m, e
        described[m.group(1)] = " ".join(m.group(2).split()).split("(type:")[0].strip()
    assert len(described) >= 10
    missing = [k for k, v in described.items() if not v]
    assert not missing, f"{name}: options without a description: {missing}"
    if name == "FolderDataModule":
        assert described["--data.test"].startswith("test files (folder, file or glob) for mmte test")
