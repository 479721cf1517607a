"""FolderDataModule sources and splits: explicit folder/file/glob sources used whole, patterns, speaker
(group) held-out splits and leave-one-group-out folds, class maps from the training split, empty-split
messages naming the option, crop policy, fitted audio statistics, and the saved data state."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

from mmte.data import datasets as mds
from mmte.data.splits import group_split, leave_one_group_out
from mmte.training.data import FolderDataModule, group_folds, read_data_state

SPEAKERS = ("anna", "bob", "cleo")
GROUP_RX = r"^\d+_([a-z]+)_"


def _wav(path, seconds=0.3, sr=8000, freq=440.0):
    """A tone gliding up from ``freq`` with a little seeded noise, so every fbank frame differs."""
    import soundfile as sf

    t = np.arange(int(seconds * sr)) / sr
    noise = np.random.default_rng(int(freq)).normal(0, 0.01, t.shape)
    sf.write(path, (0.3 * np.sin(2 * np.pi * freq * (1 + 0.5 * t) * t) + noise).astype(np.float32), sr)


@pytest.fixture(scope="module")
def wavs(tmp_path_factory):
    """27 clips ``{digit}_{speaker}_{i}.wav``: digits 0-2, three speakers, three takes; take 2 of bob is 1.5 s."""
    d = tmp_path_factory.mktemp("wavs")
    for digit in range(3):
        for s, spk in enumerate(SPEAKERS):
            for i in range(3):
                _wav(d / f"{digit}_{spk}_{i}.wav", seconds=1.5 if (spk == "bob" and i == 2) else 0.3, freq=200.0 + 60 * digit + 15 * s + 5 * i)
    return d


def _dm(d, **kw):
    base = {"modality": "audio", "pattern": "*.wav", "label_regex": r"^(\d+)_", "preprocess": {"target_rate": 8000, "num_mel_bins": 16},
            "batch_size": 4}
    return FolderDataModule(os.fspath(d), **{**base, **kw})


def test_list_files_folder_file_glob(wavs, tmp_path):
    paths, names = mds.list_files(wavs, "*.wav")
    assert len(paths) == 27 and names[0] == "0_anna_0.wav" and names == sorted(names)
    paths, names = mds.list_files(os.fspath(wavs / "1_*_2.wav"))
    assert names == ["1_anna_2.wav", "1_bob_2.wav", "1_cleo_2.wav"]  # relative to the glob's folder
    assert mds.list_files(wavs / "2_cleo_0.wav") == ([os.fspath(wavs / "2_cleo_0.wav")], ["2_cleo_0.wav"])
    with pytest.raises(FileNotFoundError, match=r"^test '.*nope' is not a folder, a file or a glob that matches files"):
        mds.list_files(tmp_path / "nope", option="test")
    with pytest.raises(ValueError, match=r"^predict '.*\*\.flac' matches no file"):
        mds.list_files(os.fspath(wavs / "*.flac"), option="predict")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no file matching pattern '\*\.wav'"):
        mds.list_files(tmp_path / "empty", "*.wav")


def test_group_split_and_leave_one_group_out():
    groups = ["a", "a", "b", "c", "c", "d"]
    parts = group_split(groups, 0.25, 0.25, seed=0)
    assert sorted(parts["train"] + parts["val"] + parts["test"]) == ["a", "b", "c", "d"]
    assert len(parts["val"]) == 1 and len(parts["test"]) == 1 and parts == group_split(groups, 0.25, 0.25, seed=0)
    with pytest.raises(ValueError, match=r"cannot hold out 1 validation and 1 test group\(s\) of 2"):
        group_split(["a", "b"], 0.5, 0.5 - 1e-9)
    folds = leave_one_group_out(groups)
    assert [f[0] for f in folds] == ["a", "b", "c", "d"]
    assert folds[2] == ("c", [0, 1, 2, 5], [3, 4])


def test_explicit_sources_are_used_whole_and_regexes_ignored(wavs, tmp_path):
    test_dir = tmp_path / "other"
    test_dir.mkdir()
    for n in ("1_zed_0.wav", "2_zed_0.wav", "2_zed_1.wav"):
        _wav(test_dir / n)
    dm = _dm(wavs, val_regex=r"_0\.wav$", test=os.fspath(test_dir), val=os.fspath(wavs / "*_cleo_*.wav"))
    dm.setup()
    # val: the glob's 9 files (val_regex is ignored); train: every data_dir file (none carved out); test: the folder
    assert dm.row_names("val") == sorted(f"{d}_cleo_{i}.wav" for d in range(3) for i in range(3))
    assert len(dm.datasets["train"]) == 27 and dm.row_names("test") == ["1_zed_0.wav", "2_zed_0.wav", "2_zed_1.wav"]
    assert dm.class_names == ["0", "1", "2"]
    labels = [int(dm.datasets["test"][i]["label"]) for i in range(3)]
    assert labels == [1, 2, 2]  # ids from the training split's class map, although the test folder has no digit 0
    batch = next(iter(dm.test_dataloader()))
    assert batch["index"].tolist() == [0, 1, 2] and batch["label"].tolist() == [1, 2, 2]


def test_group_splits_hold_out_whole_speakers(wavs):
    dm = _dm(wavs, group_regex=GROUP_RX, val_groups=["bob"], test_groups=["cleo"])
    dm.setup()
    spk = {s: {n.split("_")[1] for n in dm.row_names(s)} for s in ("train", "val", "test")}
    assert spk == {"train": {"anna"}, "val": {"bob"}, "test": {"cleo"}}
    frac = _dm(wavs, group_regex=GROUP_RX, val_fraction=0.34, seed=1)
    frac.setup()
    val_spk = {n.split("_")[1] for n in frac.row_names("val")}
    train_spk = {n.split("_")[1] for n in frac.row_names("train")}
    assert len(val_spk) == 1 and not val_spk & train_spk and len(frac.row_names("val")) == 9
    with pytest.raises(ValueError, match=r"^test_groups \['dave'\] are not groups of the training data; group_regex finds \['anna', 'bob', 'cleo'\]"):
        _dm(wavs, group_regex=GROUP_RX, test_groups=["dave"])
    with pytest.raises(ValueError, match=r"^val_groups needs group_regex"):
        _dm(wavs, val_groups=["bob"])
    folds = list(group_folds(data_dir=os.fspath(wavs), pattern="*.wav", label_regex=r"^(\d+)_", group_regex=GROUP_RX,
                                     val_fraction=0.0, preprocess={"num_mel_bins": 16}))
    assert [g for g, _ in folds] == list(SPEAKERS)
    for g, fold in folds:
        fold.setup()
        assert {n.split("_")[1] for n in fold.row_names("test")} == {g} and len(fold.row_names("test")) == 9
        assert g not in {n.split("_")[1] for n in fold.row_names("train")} and len(fold.row_names("train")) == 18


def test_empty_split_messages_name_the_option(wavs):
    dm = _dm(wavs, val_regex=r"_9\.wav$")
    with pytest.raises(ValueError) as e:
        dm.val_dataloader()
    assert str(e.value) == (
        f"the 'val' split is empty (val_regex '_9\\\\.wav$' matches no file of data_dir {os.fspath(wavs)!r}); pass "
        "--data.init_args.val <folder|file|glob>, or set val_regex / val_groups / val_fraction to carve it out of the training data"
    )
    with pytest.raises(ValueError) as e:
        dm.test_dataloader()
    assert str(e.value) == (
        "the 'test' split is empty (no test source, test_regex or test_groups is set and test_fraction is 0.0); pass "
        "--data.init_args.test <folder|file|glob>, or set test_regex / test_groups / test_fraction to carve it out of the training data"
    )
    with pytest.raises(ValueError) as e:
        _dm(wavs, val_regex=r"_9\.wav$", predict_split="val").predict_dataloader()
    assert str(e.value).startswith("the 'val' split that predict_split names is empty (val_regex")
    assert str(e.value).endswith("pass --data.init_args.predict <folder|file|glob> to predict on other data, or set predict_split")


def test_unknown_label_in_an_evaluation_split_names_the_file(wavs, tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    _wav(d / "7_zed_0.wav")
    dm = _dm(wavs, test=os.fspath(d), predict=os.fspath(d))
    with pytest.raises(ValueError, match=r"^file '7_zed_0\.wav' of the test split has label '7', which the training split does not have "
                                         r"\(classes \['0', '1', '2'\]\); remove it, or train with that class$"):
        dm.test_dataloader()
    dm.setup("predict")  # predict files need no known label: the target is left unknown (-1)
    assert int(dm.datasets["predict"][0]["label"]) == -1


def test_crop_policy_and_report(wavs, caplog):
    long_name = "0_bob_2.wav"
    with caplog.at_level(logging.INFO, logger="mmte"):
        dm = _dm(wavs, max_frames=40, crop="center", test_regex=r"_bob_2\.wav$", val_fraction=0.0)
        dm.setup("test")
    assert "test split: 3 of 3 clips are longer than max_frames=40 (0.40 s; longest 148 frames) and are cropped to their middle 40 frames" in caplog.text
    from mmte.data.audio import preprocess_audio

    full = preprocess_audio(os.fspath(wavs / long_name), target_rate=8000, num_mel_bins=16)
    assert full.shape[0] == 148  # what the header-based count said
    batch = next(iter(dm.test_dataloader()))
    assert batch["audio"]["fbank"].shape == (3, 40, 16)
    off = (148 - 40) // 2
    torch.testing.assert_close(batch["audio"]["fbank"][0], full[off : off + 40], rtol=0, atol=1e-6)
    rnd = _dm(wavs, max_frames=40, crop="random", val_regex=r"_bob_2\.wav$")
    rnd.setup("fit")
    torch.manual_seed(3)
    train_long = [i for i, n in enumerate(rnd.row_names("train")) if n == long_name]
    assert train_long == []  # the long clips are all in val here; evaluation crops random -> centre
    vb = next(iter(rnd.val_dataloader()))
    torch.testing.assert_close(vb["audio"]["fbank"][0], full[off : off + 40], rtol=0, atol=1e-6)
    start = _dm(wavs, max_frames=40, crop="start", val_regex=r"_bob_2\.wav$")
    torch.testing.assert_close(next(iter(start.val_dataloader()))["audio"]["fbank"][0], full[:40], rtol=0, atol=1e-6)


def test_random_crop_in_training_draws_windows_of_the_clip(wavs):
    from mmte.data.audio import crop_frames, preprocess_audio

    full = preprocess_audio(os.fspath(wavs / "0_bob_2.wav"), target_rate=8000, num_mel_bins=16)
    g = torch.Generator().manual_seed(0)
    offs = set()
    for _ in range(20):
        w = crop_frames(full, 40, "random", g)
        match = [o for o in range(148 - 40 + 1) if torch.equal(full[o : o + 40], w)]
        assert len(match) == 1
        offs.add(match[0])
    assert len(offs) > 5
    with pytest.raises(ValueError, match=r"^crop must be one of \('start', 'center', 'random'\); got 'middle'$"):
        _dm(wavs, crop="middle")


def test_train_fbank_statistics_are_fitted_on_train_only_and_saved(wavs, tmp_path):
    from mmte.data.audio import preprocess_audio

    dm = _dm(wavs, normalize="train", val_regex=r"_cleo_")
    raw = [preprocess_audio(os.fspath(wavs / n), target_rate=8000, num_mel_bins=16, mean=None, std=None).double()
           for n in sorted(os.listdir(wavs)) if "_cleo_" not in n]
    allv = torch.cat([r.reshape(-1) for r in raw])
    mean, std = float(allv.mean()), float(allv.std(unbiased=False))
    assert dm.fbank_stats == pytest.approx([mean, std], rel=1e-6)
    dm.setup("validate")
    item = dm.datasets["val"][0]["audio"]
    ref = preprocess_audio(os.fspath(wavs / "0_cleo_0.wav"), target_rate=8000, num_mel_bins=16, mean=mean, std=std)
    torch.testing.assert_close(item, ref, rtol=1e-5, atol=1e-5)
    # saved and read back: a run on other data does not refit
    ck = tmp_path / "m.ckpt"
    torch.save({"state_dict": {}, "FolderDataModule": dm.state_dict()}, ck)
    other = tmp_path / "loud"
    other.mkdir()
    _wav(other / "1_zed_0.wav", seconds=0.5, freq=900.0)
    again = _dm(tmp_path / "does-not-matter", state_from=os.fspath(ck), predict=os.fspath(other))
    assert again.fbank_stats == dm.fbank_stats and again.class_names == ["0", "1", "2"]
    assert read_data_state(ck, "FolderDataModule")["fbank_stats"] == dm.fbank_stats
    with pytest.raises(ValueError, match=r"holds a FolderDataModule's data state, but this run's data is a TableDataModule"):
        read_data_state(ck, "TableDataModule")


def test_state_dict_round_trip_and_restore(wavs):
    a = _dm(wavs, val_regex=r"_0\.wav$")
    sd = a.state_dict()
    assert sd == {"format": "mmte-data-state/1", "kind": "FolderDataModule", "modality": "audio", "class_names": ["0", "1", "2"], "fbank_stats": None}
    sub = _dm(wavs, pattern="[12]_*.wav")  # another run sees only digits 1 and 2
    assert sub.class_names == ["1", "2"]
    sub.setup()
    sub.load_state_dict(sd)  # what Lightning does when restoring a checkpoint
    assert sub.class_names == ["0", "1", "2"] and sub.datasets == {}
    sub.setup("fit")
    assert int(sub.datasets["train"][0]["label"]) == 1  # "1_anna_0.wav" is class 1 of the saved map
    with pytest.raises(ValueError, match=r"^the checkpoint's data is modality 'image'; this run's is 'audio'$"):
        sub.load_state_dict({**sd, "modality": "image"})


def test_group_norm_standardises_each_clip_by_its_speakers_statistics(wavs, tmp_path, caplog):
    """Per-speaker CMVN against a naive reference: every split's clips by the mean/std per mel bin of all
    that speaker's clips in the same split; a file whose name has no speaker by its own statistics."""
    from mmte.data.audio import preprocess_audio

    other = tmp_path / "new"
    other.mkdir()
    _wav(other / "1_zed_0.wav", seconds=0.4, freq=700.0)
    _wav(other / "1_zed_1.wav", seconds=0.6, freq=760.0)
    _wav(other / "untitled.wav", seconds=0.5, freq=820.0)
    dm = _dm(wavs, group_regex=GROUP_RX, val_groups=["bob"], group_norm=True, predict=os.fspath(other))
    with caplog.at_level(logging.INFO, logger="mmte"):
        dm.setup()  # every split, and predict (it has a source)
        pred = dm.datasets["predict"]

    def ref(folder, names):
        fbs = [preprocess_audio(os.fspath(folder / n), target_rate=8000, num_mel_bins=16).double() for n in names]
        allf = torch.cat(fbs, 0)
        mean, std = allf.mean(0), allf.std(0, unbiased=False)
        return {n: ((fb - mean) / std).float() for n, fb in zip(names, fbs)}

    want = {**ref(wavs, [n for n in sorted(os.listdir(wavs)) if "_anna_" in n]), **ref(wavs, [n for n in sorted(os.listdir(wavs)) if "_cleo_" in n]),
            **ref(wavs, [n for n in sorted(os.listdir(wavs)) if "_bob_" in n]), **ref(other, ["1_zed_0.wav", "1_zed_1.wav"]),
            **ref(other, ["untitled.wav"])}
    for split in ("train", "val"):
        ds = dm.datasets[split]
        assert len(ds) == len(dm.row_names(split)) > 0
        for i, n in enumerate(dm.row_names(split)):
            torch.testing.assert_close(ds[i]["audio"], want[n], rtol=1e-4, atol=1e-4)
    for i, n in enumerate(dm.row_names("predict")):
        torch.testing.assert_close(pred[i]["audio"], want[n], rtol=1e-4, atol=1e-4)
    x = torch.cat([dm.datasets["val"][i]["audio"] for i in range(9)])  # all of bob: zero mean, unit std per bin
    torch.testing.assert_close(x.mean(0), torch.zeros(16), rtol=0, atol=1e-4)
    torch.testing.assert_close(x.std(0, unbiased=False), torch.ones(16), rtol=0, atol=1e-4)
    assert "val split: each clip standardised per mel bin by its group's statistics (group_norm): 1 group(s)" in caplog.text
    assert "predict split: each clip standardised per mel bin by its group's statistics (group_norm): 1 group(s), 1 file(s)" in caplog.text
    with pytest.raises(ValueError, match=r"^group_norm is for audio with a group_regex \(the speaker\); got modality 'audio', group_regex None"):
        _dm(wavs, group_norm=True)
    with pytest.raises(ValueError, match=r"^group_norm must be true or false; got 'yes'"):
        _dm(wavs, group_regex=GROUP_RX, group_norm="yes")


def test_group_norm_with_augmentation_uses_the_unaugmented_statistics(wavs):
    """Training clips are augmented afresh each read, then standardised by their speaker's statistics of
    the unaugmented clips: with a gain-only augmentation (a constant shift of the log-mel), the shift
    survives the normalisation exactly, divided by the speaker's std."""
    plain = _dm(wavs, group_regex=GROUP_RX, test_groups=["cleo"], val_fraction=0.0, group_norm=True)
    aug = _dm(wavs, group_regex=GROUP_RX, test_groups=["cleo"], val_fraction=0.0, group_norm=True, augment={"gain_db": 6})
    plain.setup("fit")
    aug.setup("fit")
    a, b = plain.datasets["train"][0]["audio"], aug.datasets["train"][0]["audio"]
    assert a.shape == b.shape
    d = b - a
    assert not torch.allclose(d, torch.zeros_like(d), atol=1e-3)
    torch.testing.assert_close(d, d[0:1].expand_as(d), rtol=0, atol=2e-3)  # the same per-bin shift in every frame


def test_missing_data_dir_and_corrupt_files_are_refused_by_name(wavs, tmp_path, caplog):
    """A data_dir that is not a folder, and an unreadable WAV (refused before training, or dropped with one
    warning under ``on_corrupt: skip``)."""
    with pytest.raises(FileNotFoundError, match=r"^data_dir '.*nowhere' is not a folder, a file or a glob that matches files; give an existing folder, file or glob$"):
        _dm(tmp_path / "nowhere").setup("fit")
    d = tmp_path / "some"
    d.mkdir()
    for p in sorted(wavs.glob("[01]_*_0.wav")):
        (d / p.name).symlink_to(p)
    bad = d / "1_bob_9.wav"
    bad.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage")
    with pytest.raises(ValueError, match=rf"^corrupt audio file {str(bad)!r}: .* \(set on_corrupt: skip to drop such files\)$"):
        _dm(d, val_fraction=0.0).setup("fit")
    dm = _dm(d, val_fraction=0.0, on_corrupt="skip")
    with caplog.at_level(logging.WARNING):
        dm.setup("fit")
    assert len(dm.datasets["train"]) == 6
    assert f"skipped 1 unreadable audio file(s) of 7 (first: {bad})" in caplog.text
    assert next(iter(dm.train_dataloader()))["label"].shape == (4,)
