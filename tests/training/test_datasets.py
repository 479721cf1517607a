"""mmte.data.datasets and the DataModules: labels from names / CSV, file checks, stratified splits,
label pairing, Arrow-cache reuse, per-epoch seeded shuffling."""

from __future__ import annotations

import logging
import os
from collections import Counter

import numpy as np
import pytest
import torch

from mmte.data import datasets as mds
from mmte.data.splits import split_indices


def _wav(path, seconds=0.3, sr=8000, freq=440.0):
    import soundfile as sf

    t = np.arange(int(seconds * sr)) / sr
    sf.write(path, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), sr)


@pytest.fixture
def wav_dir(tmp_path):
    d = tmp_path / "wavs"
    d.mkdir()
    for digit in (0, 1, 2, 10):
        for i in range(4):
            _wav(d / f"{digit}_spk_{i}.wav", freq=200.0 + 50 * digit + 10 * i)
    return d


def test_files_dataset_labels_from_names_sorted_numerically(wav_dir):
    ds, classes = mds.files_dataset(wav_dir, "*.wav", label_regex=r"^(\d+)_")
    assert classes == ["0", "1", "2", "10"]  # numeric order, not "10" < "2"
    assert len(ds) == 16
    for name, label in zip(ds["name"], ds["label"]):
        assert classes[label] == name.split("_")[0]


def test_files_dataset_labels_from_csv(wav_dir, tmp_path):
    csv = tmp_path / "labels.csv"
    rows = ["file,label"] + [f"{p.name},{'low' if p.name.startswith(('0_', '1_')) else 'high'}" for p in sorted(wav_dir.glob("*.wav"))]
    csv.write_text("\n".join(rows) + "\n")
    ds, classes = mds.files_dataset(wav_dir, "*.wav", labels_csv=csv)
    assert classes == ["high", "low"]
    assert Counter(ds["label"]) == {0: 8, 1: 8}
    csv.write_text("\n".join(rows[:-1]) + "\n")  # one file without a row
    with pytest.raises(ValueError, match="has no row in labels_csv"):
        mds.files_dataset(wav_dir, "*.wav", labels_csv=csv)


def test_files_dataset_bad_input(tmp_path, wav_dir):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        mds.files_dataset(tmp_path / "nope", "*.wav", label_regex=r"^(\d+)_")
    with pytest.raises(ValueError, match="no file in"):
        mds.files_dataset(wav_dir, "*.flac", label_regex=r"^(\d+)_")
    with pytest.raises(ValueError, match="does not match label_regex"):
        mds.files_dataset(wav_dir, "*.wav", label_regex=r"^x(\d+)_")
    with pytest.raises(ValueError, match="exactly one of"):
        mds.files_dataset(wav_dir, "*.wav")


def test_check_files_error_and_skip(wav_dir, caplog):
    (wav_dir / "3_spk_0.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")  # a truncated header
    paths = sorted(os.fspath(p) for p in wav_dir.glob("*.wav"))
    with pytest.raises(ValueError, match=r"corrupt audio file .*3_spk_0\.wav"):
        mds.check_files(paths, "audio", "error")
    with caplog.at_level(logging.WARNING):
        good = mds.check_files(paths, "audio", "skip")
    assert len(good) == len(paths) - 1 and paths.index(os.fspath(wav_dir / "3_spk_0.wav")) not in good
    assert "skipped 1 unreadable audio file(s) of 17" in caplog.text


def test_split_indices_stratified_deterministic():
    labels = np.repeat(np.arange(5), [10, 20, 30, 40, 50])
    a = split_indices(labels, 0.2, 0.1, seed=3)
    b = split_indices(labels, 0.2, 0.1, seed=3)
    c = split_indices(labels, 0.2, 0.1, seed=4)
    assert a == b and a != c
    allidx = a["train"] + a["val"] + a["test"]
    assert sorted(allidx) == list(range(len(labels)))  # a partition
    for cls, n in enumerate([10, 20, 30, 40, 50]):
        assert sum(labels[i] == cls for i in a["val"]) == round(0.2 * n)
        assert sum(labels[i] == cls for i in a["test"]) == round(0.1 * n)
    with pytest.raises(ValueError, match="must be < 1"):
        split_indices(labels, 0.6, 0.5)


def test_arrays_dataset_keeps_every_value_shape_and_dtype():
    """Fixed-shape arrays (built from the flat buffer) and ragged object arrays read back item by item."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 3, 5)).astype(np.float32)
    y = rng.integers(0, 4, size=37)
    ds = mds.arrays_dataset(x, y, "image").with_format("numpy")
    assert len(ds) == 37 and ds.column_names == ["image", "label"]
    for i in (0, 17, 36):
        np.testing.assert_array_equal(ds[i]["image"], x[i])  # exact: no conversion of the values
        assert ds[i]["image"].dtype == np.float32 and int(ds[i]["label"]) == int(y[i])
    starts = mds.arrays_dataset(np.arange(5, dtype=np.int64), None, "start")
    assert starts["start"] == [0, 1, 2, 3, 4] and starts.column_names == ["start"]
    ragged = np.empty(2, dtype=object)
    ragged[0], ragged[1] = np.arange(3), np.arange(5)
    assert mds.arrays_dataset(ragged, None, "row")["row"] == [[0, 1, 2], [0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="differ in length"):
        mds.arrays_dataset(x, y[:3])


def test_pair_by_label():
    la, lb = [0, 1, 1, 2, 0, 0], [1, 0, 2, 2, 1]
    pairs = mds.pair_by_label(la, lb, seed=1)
    assert [i for i, _ in pairs] == list(range(len(la)))
    assert all(la[i] == lb[j] for i, j in pairs)
    zeros = [j for i, j in pairs if la[i] == 0]
    assert zeros == [1, 1, 1]  # only one 0 in b: reused
    ones = [j for i, j in pairs if la[i] == 1]
    assert sorted(ones) == [0, 4]  # cycles through both before repeating
    with pytest.raises(ValueError, match="labels \\[3\\]"):
        mds.pair_by_label([3], [0, 1])


def test_read_table_csv_and_missing_column(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b,color,target\n1,2.5,red,0\n3,4.5,blue,1\n5,6.5,red,0\n")
    ds = mds.read_table(p, ["a", "target"], cache_dir=tmp_path / "cache")
    assert ds.column_names == ["a", "b", "color", "target"] and ds["a"] == [1, 3, 5]
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['label'\]; it has \['a', 'b', 'color', 'target'\]"):
        mds.read_table(p, ["label"])


def test_cached_preprocess_reuses_arrow_file(wav_dir, tmp_path):
    from mmte.data.audio import preprocess_audio

    ds, _ = mds.files_dataset(wav_dir, "*.wav", label_regex=r"^(\d+)_")
    calls = []

    def fn(path):
        calls.append(path)
        return preprocess_audio(path, num_mel_bins=32)

    cache = tmp_path / "cache"
    a = mds.cached_preprocess(ds, {"audio": ("path", fn)}, cache, key=("audio", 32))
    n_first = len(calls)
    assert n_first == len(ds) and len(list(cache.glob("mmte-*.arrow"))) == 1
    b = mds.cached_preprocess(ds, {"audio": ("path", fn)}, cache, key=("audio", 32))
    assert len(calls) == n_first  # nothing recomputed
    lazy = mds.lazy_preprocess(ds, {"audio": ("path", lambda p: preprocess_audio(p, num_mel_bins=32))})
    for i in (0, 7, 15):
        torch.testing.assert_close(b[i]["audio"], lazy[i]["audio"], rtol=0, atol=1e-6)
        assert int(a[i]["label"]) == lazy[i]["label"]
    mds.cached_preprocess(ds, {"audio": ("path", fn)}, cache, key=("audio", 64))  # another option: another file
    assert len(list(cache.glob("mmte-*.arrow"))) == 2


def test_train_sampler_is_seeded_by_seed_and_epoch():
    from mmte.training.data import train_sampler

    s = train_sampler(50, seed=7)
    e0 = list(s)
    assert sorted(e0) == list(range(50)) and list(s) == e0
    s.set_epoch(1)
    e1 = list(s)
    assert e1 != e0 and sorted(e1) == list(range(50))
    t = train_sampler(50, seed=7)
    t.set_epoch(1)
    torch.manual_seed(123)  # the global RNG has no influence
    assert list(t) == e1


def test_folder_datamodule_batches(wav_dir):
    from mmte.training.data import FolderDataModule

    dm = FolderDataModule(os.fspath(wav_dir), "audio", "*.wav", label_regex=r"^(\d+)_", val_regex=r"_[0]\.wav$",
                          preprocess={"num_mel_bins": 32}, batch_size=4, max_frames=20)
    assert dm.model_info == {"num_classes": 4, "audio_frontend": "kaldi"}  # the stem must read what the data computes
    dm.setup("fit")
    assert len(dm.datasets["val"]) == 4 and len(dm.datasets["train"]) == 12
    batch = next(iter(dm.val_dataloader()))
    assert batch["audio"]["fbank"].shape == (4, 20, 32) and batch["audio"]["frames"].tolist() == [20] * 4
    assert batch["label"].tolist() == [0, 3, 1, 2]  # files in name order: 0_, 10_, 1_, 2_
    assert dm.row_names("val")[0] == "0_spk_0.wav"


def test_array_and_paired_datamodules(wav_dir):
    from mmte.training.data import ArrayDataModule, FolderDataModule, PairedDataModule

    img = ArrayDataModule("digits", "image", {"size": None, "mean": None, "std": None, "channels": 1}, val_fraction=0.2)
    x, y, _ = mds.sklearn_arrays("digits")
    img.setup()
    item = img.datasets["val"][3]
    assert item["index"] == 3  # the position in the split; indices[split] maps it to the dataset's row
    row = img.indices["val"][3]
    torch.testing.assert_close(item["image"][0], torch.from_numpy(x[row]), rtol=0, atol=0)
    assert item["label"] == y[row] and img.row_names("val")[3] == f"digits[{row}]"
    audio = FolderDataModule(os.fspath(wav_dir), "audio", "*.wav", label_regex=r"^(\d+)_", preprocess={"num_mel_bins": 32})
    with pytest.raises(ValueError, match="class names differ"):
        PairedDataModule(audio, img)
    sub = FolderDataModule(os.fspath(wav_dir), "audio", "[012]_*.wav", label_regex=r"^(\d+)_", preprocess={"num_mel_bins": 32})
    assert sub.class_names == ["0", "1", "2"]
    img3 = ArrayDataModule("digits", "image", {"size": None, "channels": 1, "mean": None, "std": None})
    img3.class_names = ["0", "1", "2"]
    pdm = PairedDataModule(sub, img3, batch_size=5)
    pdm.setup()
    batch = next(iter(pdm.train_dataloader()))
    assert set(batch) == {"audio", "image", "label", "index"}
    assert batch["image"].shape[1:] == (1, 8, 8)
    # each pair's image shows the spoken digit
    raw = pdm.datasets["train"].with_format(None)
    for k in range(len(raw)):
        a, b, lab = raw[k]["a"], raw[k]["b"], raw[k]["label"]
        assert sub.datasets["train"].with_format(None)[a]["label"] == lab
        assert img3.datasets["train"].with_format(None)[b]["label"] == lab


def test_forecast_datamodule_windows_against_pandas(tmp_path):
    import pandas as pd

    from mmte.training.data import ForecastDataModule

    rng = np.random.default_rng(0)
    n = 200
    df = pd.DataFrame({"date": pd.date_range("2020-01-01", periods=n, freq="h").astype(str),
                       "a": rng.normal(size=n).cumsum(), "b": rng.normal(5, 2, size=n)})
    p = tmp_path / "s.csv"
    df.to_csv(p, index=False)
    dm = ForecastDataModule(str(p), input_len=24, horizon=8, borders=[0, 120, 160, 200], train_step=3, eval_step=5, batch_size=4)
    assert dm.model_info == {"tokenizers": {"time_series": {"num_channels": 2}}, "horizon": 8, "input_len": 24}
    dm.setup()
    vals = df[["a", "b"]].to_numpy()
    mean, std = vals[:120].mean(0), vals[:120].std(0)  # train-split statistics only
    z = (vals - mean) / std
    train = dm.datasets["train"]
    assert len(train) == len(range(0, 120 - 24 - 8 + 1, 3))
    val = dm.datasets["val"]
    first = val[0]
    starts = dm.row_columns("val")["start_row"]
    assert first["index"] == 0 and starts[0] == 120 - 24  # validation windows start input_len before the border
    assert dm.row_names("val")[0] == str(df["date"].iloc[96]).replace(" ", "T")  # ids: the window's start time
    np.testing.assert_allclose(first["time_series"].numpy(), z[96:120], rtol=0, atol=1e-5)
    np.testing.assert_allclose(first["target"].numpy(), z[120:128], rtol=0, atol=1e-5)
    assert starts == list(range(96, 160 - 24 - 8 + 1, 5))
    with pytest.raises(ValueError, match=r"columns \['c'\] are not in"):
        ForecastDataModule(str(p), columns=["a", "c"])


def test_table_datamodule_encodes_with_train_statistics(tmp_path):
    import pandas as pd

    from mmte.training.data import TableDataModule

    rng = np.random.default_rng(1)
    n = 60
    df = pd.DataFrame({"x": rng.normal(3, 2, n), "color": rng.choice(["red", "green", "blue"], n), "y": rng.choice(["no", "yes"], n)})
    p = tmp_path / "t.csv"
    df.to_csv(p, index=False)
    dm = TableDataModule(str(p), label_column="y", val_fraction=0.25, seed=2, batch_size=16)
    info = dm.model_info
    assert info["num_classes"] == 2 and dm.class_names == ["no", "yes"]
    assert info["tokenizers"]["tabular"] == {"num_numeric": 1, "cardinalities": [3]}
    dm.setup()
    train_idx = [int(i) for i in dm.row_names("train")]  # ids: the rows of the file
    mu, sd = df["x"].iloc[train_idx].mean(), df["x"].iloc[train_idx].std(ddof=0)
    item = dm.datasets["val"][0]
    row = df.iloc[int(dm.row_names("val")[item["index"]])]
    assert abs(float(item["tabular"]["numeric"][0]) - (row["x"] - mu) / sd) < 1e-5
    assert item["label"] == ["no", "yes"].index(row["y"])
    batch = next(iter(dm.train_dataloader()))
    assert batch["tabular"]["numeric"].shape == (16, 1) and batch["tabular"]["categorical"].shape == (16, 1)


def test_array_datamodule_arrow_cache_equals_lazy(tmp_path):
    from mmte.training.data import ArrayDataModule

    pre = {"size": None, "mean": [0.5], "std": [0.5], "channels": 1}
    lazy = ArrayDataModule("digits", "image", pre, batch_size=32)
    cached = ArrayDataModule("digits", "image", pre, batch_size=32, cache_dir=str(tmp_path / "c"))
    bl, bc = next(iter(lazy.val_dataloader())), next(iter(cached.val_dataloader()))
    torch.testing.assert_close(bc["image"], bl["image"], rtol=0, atol=1e-6)
    assert bc["label"].tolist() == bl["label"].tolist() and bc["index"].tolist() == bl["index"].tolist()
    assert len(list((tmp_path / "c").glob("mmte-*.arrow"))) == 1  # only the split asked for is built
    next(iter(cached.train_dataloader()))
    assert len(list((tmp_path / "c").glob("mmte-*.arrow"))) == 2


def test_digits_read_from_the_bundled_file_equal_scikit_learns_loader():
    from sklearn.datasets import load_digits

    x, y, names = mds.sklearn_arrays("digits")
    d = load_digits()
    np.testing.assert_array_equal(x, np.asarray(d.images, dtype=np.float32) / 16.0)
    np.testing.assert_array_equal(y, d.target)
    assert names == [str(n) for n in d.target_names] and x.dtype == np.float32 and x.shape == (1797, 8, 8)
