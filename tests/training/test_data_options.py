"""Data options the recipes rely on: FolderDataModule's training-only ``augment`` and
TableDataModule's ``batch_size: auto``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmte.training.data import FolderDataModule, TableDataModule


@pytest.fixture
def wav_folder(tmp_path):
    import soundfile as sf

    g = np.random.default_rng(0)
    for label in ("0", "1"):
        for spk in ("ann", "bob", "cid"):
            t = np.arange(4000) / 8000
            w = 0.3 * np.sin(2 * np.pi * (200 + 100 * int(label)) * t) + 0.01 * g.standard_normal(4000)
            sf.write(tmp_path / f"{label}_{spk}_0.wav", w.astype(np.float32), 8000)
    return tmp_path


AUG = {"speed": [0.9, 1.1], "noise_snr_db": [10, 30], "freq_masks": 1, "freq_width": 4, "eq_db": 6}


def _dm(folder, augment):
    return FolderDataModule(data_dir=str(folder), pattern="*.wav", label_regex=r"^(\d+)_", group_regex=r"^\d+_([a-z]+)_",
                            val_groups=["bob"], test_groups=["cid"], preprocess={"target_rate": 8000, "num_mel_bins": 16},
                            augment=augment, batch_size=2)


def test_augment_changes_training_items_only(wav_folder):
    aug, plain = _dm(wav_folder, AUG), _dm(wav_folder, None)
    aug.setup()
    plain.setup()
    torch.manual_seed(0)
    a1 = [aug.datasets["train"][i]["audio"] for i in range(2)]
    a2 = [aug.datasets["train"][i]["audio"] for i in range(2)]
    p = [plain.datasets["train"][i]["audio"] for i in range(2)]
    assert all(not (x.shape == y.shape and torch.equal(x, y)) for x, y in zip(a1, a2))  # a fresh draw each read
    assert all(not (x.shape == y.shape and torch.equal(x, y)) for x, y in zip(a1, p))
    for split in ("val", "test"):  # evaluation data is never augmented
        for i in range(len(plain.datasets[split])):
            torch.testing.assert_close(aug.datasets[split][i]["audio"], plain.datasets[split][i]["audio"], rtol=0, atol=0)


def test_augment_errors(wav_folder):
    with pytest.raises(ValueError) as e:
        FolderDataModule(data_dir=str(wav_folder), modality="image", pattern="*.wav", label_regex=r"^(\d+)_", augment={"speed": [0.9, 1.1]})
    assert str(e.value) == "augment is for audio; modality is 'image'"
    with pytest.raises(ValueError, match=r"^unknown augment option\(s\) \['reverb'\]; expected some of \["):
        _dm(wav_folder, {"reverb": 0.3})


def test_batch_size_auto_follows_the_table(shared_data):
    path = str(shared_data / "tabular" / "diamonds.csv")
    dm = TableDataModule(path=path, label_column="cut", val_fraction=0.1, test_fraction=0.2, batch_size="auto")
    dm.setup("fit")
    n = len(dm.datasets["train"])  # the training split the module built
    assert abs(n - 0.7 * 53940) < 5
    assert dm.batch_size == 2 ** round(math.log2(n / 200)) == 256 and dm.eval_batch_size == 512
    small = TableDataModule(path="sklearn://wine", val_fraction=0.25, batch_size="auto")
    assert small.batch_size == 16  # 133 rows: the floor
    with pytest.raises(ValueError) as e:
        TableDataModule(path="sklearn://wine", batch_size="large")
    assert str(e.value) == "batch_size must be a positive int or 'auto'; got 'large'"


@pytest.mark.parametrize(
    "option, message",
    [
        ({"batch_size": 0}, "batch_size must be a positive int; got 0"),
        ({"val_fraction": 1.5}, "val_fraction must be in [0, 1); got 1.5"),
        ({"test_fraction": -0.1}, "test_fraction must be in [0, 1); got -0.1"),
        ({"eval_batch_size": 0}, "eval_batch_size must be a positive int or null; got 0"),
    ],
    ids=["batch_size_0", "val_fraction_1.5", "test_fraction_negative", "eval_batch_size_0"],
)
def test_loader_options_are_checked_when_the_data_module_is_built(option, message):
    """What ``--data.init_args.*`` sets is refused by the DataModule itself, in one line, before any file is read."""
    with pytest.raises(ValueError) as e:
        TableDataModule(path="/nonexistent/never-read.csv", label_column="target", **option)
    assert str(e.value) == message
