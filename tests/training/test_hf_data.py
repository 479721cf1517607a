"""HFDataModule, map-style: real Hugging Face datasets built locally from ../shared/data (FSDD as an ``Audio`` +
``ClassLabel`` dataset with a speaker column, as a ``save_to_disk`` folder and as an ``audiofolder``; the
diamonds table as parquet shards; scikit-learn's digits as an ``Image`` dataset). Through ``mmte fit`` the
speaker recipe trained from the Hugging Face dataset has the folder path's per-step losses (same seed, same
order), and ``mmte predict`` on another dataset names its rows by the id column and its predictions by the
``ClassLabel``'s names. Bad inputs are one line naming the dataset, the column or split and what exists."""

from __future__ import annotations

import csv
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mmte.training.data import FolderDataModule, HFDataModule
from tests.training.hf_fixtures import fsdd_subset, save_fsdd

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
FSDD = DATA / "fsdd" / "recordings"
DIGITS = ("0", "1", "2")


@pytest.fixture(scope="module")
def fsdd(tmp_path_factory):
    """Training clips (george, jackson; theo for validation) as a folder and a save_to_disk dataset, and
    another speaker's clips (nicolas) as a second dataset to predict on."""
    d = tmp_path_factory.mktemp("fsdd")
    files = fsdd_subset(d / "wavs", ("george", "jackson", "theo"))
    other = fsdd_subset(d / "other", ("nicolas",), takes=range(2))
    return {"wavs": d / "wavs", "hf": save_fsdd(files, d / "hf"), "other": save_fsdd(other, d / "other_hf")}


OPTS = {"preprocess": {"target_rate": 16000, "num_mel_bins": 32}, "min_frames": 16, "max_frames": 64, "batch_size": 4, "seed": 0}


def test_save_to_disk_items_equal_the_folder_path(fsdd):
    folder = FolderDataModule(str(fsdd["wavs"]), modality="audio", pattern="*.wav", label_regex=r"^(\d+)_", group_regex=r"^\d+_([a-z]+)_",
                              val_groups=["theo"], **OPTS)
    hf = HFDataModule(str(fsdd["hf"]), columns={"audio": "audio"}, label_column="digit", id_column="file", group_column="speaker", val_groups=["theo"], **OPTS)
    for dm in (folder, hf):
        dm.setup("fit")
    assert hf.class_names == folder.class_names == list(DIGITS)
    assert len(hf.datasets["train"]) == len(folder.datasets["train"]) == 24 and hf.names["val"] == folder.names["val"]
    for a, b in zip(folder.train_dataloader(), hf.train_dataloader()):
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["index"], b["index"])
        assert torch.equal(a["audio"]["fbank"], b["audio"]["fbank"]) and torch.equal(a["audio"]["frames"], b["audio"]["frames"])


def _audiofolder_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("audiofolder read by")]


def test_audiofolder_per_digit_folders_items_equal_the_folder_path(fsdd, tmp_path, caplog):
    """train/<digit>/ and validation/<digit>/ folders: the split and the label ClassLabel come from the folders
    (torchcodec or not), and the items equal the folder path's with the same speaker held out."""
    from mmte.data.hf_source import torchcodec_works

    d = tmp_path / "af"
    for f in sorted(fsdd["wavs"].glob("*.wav")):
        digit, spk, _ = f.stem.split("_")
        (d / ("validation" if spk == "theo" else "train") / digit).mkdir(parents=True, exist_ok=True)
        shutil.copy(f, d / ("validation" if spk == "theo" else "train") / digit)
    folder = FolderDataModule(str(fsdd["wavs"]), modality="audio", pattern="*.wav", label_regex=r"^(\d+)_", group_regex=r"^\d+_([a-z]+)_",
                              val_groups=["theo"], **OPTS)
    with caplog.at_level("INFO", logger="mmte.data.hf_source"):
        hf = HFDataModule("audiofolder", data_dir=str(d), columns={"audio": "audio"}, label_column="label", **OPTS)
    assert len(_audiofolder_log(caplog)) == (0 if torchcodec_works() else 1)
    for dm in (folder, hf):
        dm.setup("fit")
    assert hf.class_names == folder.class_names == list(DIGITS)
    assert len(hf.datasets["train"]) == len(folder.datasets["train"]) == 24 and len(hf.datasets["val"]) == len(folder.datasets["val"]) == 12
    for split in ("train", "val"):
        for a, b in zip(getattr(folder, f"{split}_dataloader")(), getattr(hf, f"{split}_dataloader")()):
            assert torch.equal(a["label"], b["label"])
            assert torch.equal(a["audio"]["fbank"], b["audio"]["fbank"]) and torch.equal(a["audio"]["frames"], b["audio"]["frames"])
    streamed = HFDataModule("audiofolder", data_dir=str(d), columns={"audio": "audio"}, label_column="label", streaming=True, **OPTS)
    streamed.setup("fit")  # a stream's validation split is read whole (its Audio column cast, not re-encoded)
    for a, b in zip(folder.val_dataloader(), streamed.val_dataloader()):
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["audio"]["fbank"], b["audio"]["fbank"])


def test_audiofolder_builder_reads_metadata(fsdd, tmp_path):
    """A metadata.csv's rows are the dataset: its file_name column becomes the audio paths and its other
    columns join (speaker holds theo out), the items equal the save_to_disk dataset's."""
    from mmte.data.hf_source import load_source

    d = tmp_path / "af"
    shutil.copytree(fsdd["wavs"], d)
    names = sorted(p.name for p in d.glob("*.wav"))
    with open(d / "metadata.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["file_name", "digit", "speaker"])
        w.writerows([n, n.split("_")[0], n.split("_")[1]] for n in names)
    raw = load_source("audiofolder", data_dir=str(d))["train"]
    assert raw.column_names == ["audio", "digit", "speaker"] and len(raw) == len(names)
    for row in raw.cast_column("audio", __import__("datasets").Audio(decode=False)):
        stem = Path(row["audio"]["path"]).stem
        assert [str(row["digit"]), row["speaker"]] == stem.split("_")[:2] and Path(row["audio"]["path"]).parent == d
    kw = {"columns": {"audio": "audio"}, "label_column": "digit", "group_column": "speaker", "val_groups": ["theo"], **OPTS}
    dm = HFDataModule("audiofolder", data_dir=str(d), **kw)
    saved = HFDataModule(str(fsdd["hf"]), **kw)
    for m in (dm, saved):
        m.setup("fit")
    assert dm.class_names == list(DIGITS) and len(dm.datasets["val"]) == 12 and len(dm.datasets["train"]) == 24
    for a, b in zip(saved.train_dataloader(), dm.train_dataloader()):
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["audio"]["fbank"], b["audio"]["fbank"])
    assert next(iter(dm.val_dataloader()))["audio"]["fbank"].shape[-1] == 32


def test_parquet_shards_tabular_and_their_own_splits(tmp_path):
    import pandas as pd

    from tests.conftest import need_data

    frame = pd.read_csv(need_data(DATA / "tabular" / "diamonds.csv", "diamonds.csv")).iloc[:3000]
    for i in range(3):
        frame.iloc[i * 800:(i + 1) * 800].to_parquet(tmp_path / f"train-{i}.parquet")
    frame.iloc[2400:].to_parquet(tmp_path / "validation.parquet")
    feats = ["carat", "depth", "table", "price", "color", "clarity"]
    dm = HFDataModule("parquet", data_files={"train": str(tmp_path / "train-*.parquet"), "validation": str(tmp_path / "validation.parquet")},
                      columns={"tabular": feats}, label_column="cut", batch_size=32)
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 2400 and len(dm.datasets["val"]) == 600  # the dataset's validation split, found by name
    assert dm.class_names == sorted(frame["cut"].iloc[:2400].unique())
    info = dm.model_info
    assert info["num_classes"] == 5 and info["tokenizers"]["tabular"]["num_numeric"] == 4 and len(info["tokenizers"]["tabular"]["cardinalities"]) == 2
    batch = next(iter(dm.train_dataloader()))
    assert batch["tabular"]["numeric"].shape == (32, 4) and batch["tabular"]["categorical"].dtype == torch.int64


def test_image_dataset_from_sklearn_digits(tmp_path):
    import datasets
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs = (d.images[:200] * 255 / 16).astype(np.uint8)
    ds = datasets.Dataset.from_dict({"img": list(imgs), "label": d.target[:200].tolist()},
                                    features=datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=[f"d{k}" for k in range(10)])}))
    ds.train_test_split(test_size=0.25, seed=0).save_to_disk(str(tmp_path / "digits"))
    dm = HFDataModule(str(tmp_path / "digits"), columns={"image": "img"}, preprocess={"size": None, "mean": [0.5], "std": [0.5], "channels": 1}, batch_size=16)
    dm.setup("fit")
    dm.setup("test")
    assert dm.class_names == [f"d{k}" for k in range(10)] and len(dm.datasets["test"]) == 50
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (16, 1, 8, 8) and batch["label"].dtype == torch.int64


@pytest.mark.parametrize("kw,message", [
    ({"columns": {"audio": "sound"}}, r"^dataset '.*hf' \(train\) has no column 'sound' \(columns.audio\); it has \['audio', 'digit', 'speaker', 'file'\]$"),
    ({"label_column": "speakr"}, r"has no column 'speakr' \(label_column\); it has"),
    ({"val_split": "dev"}, r"^dataset '.*hf' has no split 'dev' \(val_split\); it has \['train'\]$"),
    ({"train_split": "training"}, r"has no split 'training' \(train_split\); it has \['train'\]$"),
    ({"columns": {"audio": "digit"}}, r"column 'digit' \(columns.audio\) is a ClassLabel; expected an Audio feature or file paths$"),
    ({"val_groups": ["zed"]}, r"^val_groups \['zed'\] are not groups of column 'speaker' .*; it has \['george', 'jackson', 'theo'\]$"),
])
def test_bad_inputs_are_one_line(fsdd, kw, message):
    base = {"columns": {"audio": "audio"}, "label_column": "digit", "group_column": "speaker", **OPTS}
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        HFDataModule(str(fsdd["hf"]), **{**base, **kw})


def test_label_column_that_is_not_categorical(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"x": [[1.0, 2.0]] * 4, "y": [0.5, 1.5, 2.5, 3.5]}).save_to_disk(str(tmp_path / "reg"))
    with pytest.raises(ValueError, match=r"label column 'y' holds float64 numbers, not categories; use a ClassLabel, string or integer column"):
        HFDataModule(str(tmp_path / "reg"), columns={"time_series": "x"}, label_column="y")


def test_hub_id_not_in_the_cache_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"^path 'nobody/no-such-dataset': no such dataset in the local Hugging Face cache .*\(hub\)"):
        HFDataModule("nobody/no-such-dataset", columns={"audio": "audio"})


def _cli_fit(tmp: Path, runs: dict[str, list[str]]) -> dict:
    spec, out = tmp / "runs.json", tmp / "out.json"
    spec.write_text(json.dumps(runs))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "parallel" / "cli_fit.py"), str(out), str(spec)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_speaker_recipe_from_hf_matches_folder_losses_and_predicts_with_class_names(fsdd, tmp_path):
    """recipes/fsdd_speakers.yaml (augmentation, random crops) with configs/data/hf-fsdd-speakers.yaml stacked: the
    per-step losses are the folder path's; then predict on another dataset (a speaker never seen) by --ckpt_path."""
    common = ["--config", str(ROOT / "recipes" / "fsdd_speakers.yaml"), "--config", str(ROOT / "configs" / "encoders" / "tiny.yaml"),
              "--precision", "32-true", "--model.tokenizers.audio.stem_weights", "null", "--data.init_args.batch_size", "8",
              "--trainer.max_steps", "5", "--trainer.limit_val_batches", "1", "--trainer.log_every_n_steps", "1",
              "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    hf = ["--config", str(ROOT / "configs" / "data" / "hf-fsdd-speakers.yaml"), "--data.init_args.path", str(fsdd["hf"])]
    runs = {"folder": [*common, "--data.init_args.data_dir", str(fsdd["wavs"]), "--trainer.default_root_dir", str(tmp_path / "folder")],
            "hf": [*common, *hf, "--trainer.default_root_dir", str(tmp_path / "hf")]}
    got = _cli_fit(tmp_path, runs)
    assert "error" not in got["hf"], got["hf"]
    a, b = got["folder"]["losses"], got["hf"]["losses"]
    assert len(a) == len(b) == 5 and all(np.isfinite(a))
    assert max(abs(x - y) for x, y in zip(a, b)) <= 1e-6, (a, b)

    out = tmp_path / "pred.csv"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "mmte", "predict", *common, *hf, "--trainer.default_root_dir", str(tmp_path / "hf"),
                        "--ckpt_path", str(tmp_path / "hf" / "checkpoints" / "last.ckpt"), "--data.init_args.predict", str(fsdd["other"]),
                        "--prediction_writer.output", str(out), "--prediction_writer.print_rows", "0"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"] for r in rows] == sorted(os.path.basename(f) for f in glob.glob(str(fsdd["wavs"].parent / "other" / "*.wav")))
    assert {r["pred"] for r in rows} <= set(DIGITS) and [r["target"] for r in rows] == [r["id"].split("_")[0] for r in rows]
