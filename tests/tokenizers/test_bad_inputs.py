"""Bad input raises ValueError / TypeError naming the offending value and what was expected."""

from __future__ import annotations

import pytest
import torch

import mmte
from mmte.data.audio import compute_fbank
from mmte.data.tabular import TabularEncoder


def test_wrong_channel_count():
    tok = mmte.tokenizers.create("image", dim=32, img_size=32, patch_size=16)
    with pytest.raises(ValueError, match=r"expects images \[B, 3, H, W\]; got shape \(2, 1, 32, 32\)"):
        tok(torch.zeros(2, 1, 32, 32))
    ir = mmte.tokenizers.create("infrared", dim=32, img_size=32, patch_size=16)
    with pytest.raises(ValueError, match=r"\[B, 1, H, W\]; got shape \(2, 3, 32, 32\)"):
        ir(torch.zeros(2, 3, 32, 32))
    imu = mmte.tokenizers.create("imu", dim=32)
    with pytest.raises(ValueError, match=r"\[B, T, 6\]; got shape \(1, 100, 3\)"):
        imu(torch.zeros(1, 100, 3))
    ts = mmte.tokenizers.create("time_series", dim=32, num_channels=7)
    with pytest.raises(ValueError, match=r"C=7\]; got shape \(1, 96, 3\)"):
        ts(torch.zeros(1, 96, 3))
    audio = mmte.tokenizers.create("audio", dim=32)
    with pytest.raises(ValueError, match=r"fbank \[B, T, F=128\]; got shape \(2, 100, 64\)"):
        audio(torch.zeros(2, 100, 64))


def test_too_few_points_for_group_size():
    tok = mmte.tokenizers.create("point_cloud", dim=32, num_groups=8, group_size=32, hidden=(16, 32))
    with pytest.raises(ValueError, match="group_size k=32 exceeds the 20 points"):
        tok(torch.randn(1, 20, 3))
    # a padded cloud counts only its real points
    with pytest.raises(ValueError, match="exceeds the 25 points"):
        tok(torch.randn(2, 64, 3), num_points=torch.tensor([64, 25]))


def test_nan_in_waveform():
    w = torch.randn(16000) * 0.1
    w[1234] = float("nan")
    with pytest.raises(ValueError, match="non-finite sample \\(nan\\) at index 1234"):
        compute_fbank(w, 16000)
    tok = mmte.tokenizers.create("audio", dim=32)
    with pytest.raises(ValueError, match="at index 1234"):
        tok(waveform=w[None])


def test_ragged_tabular_rows():
    enc = TabularEncoder(numeric=[0, 1], categorical=[2])
    with pytest.raises(ValueError, match="row 2 has 2 values; expected 3"):
        enc.fit([[1.0, 2.0, "a"], [3.0, 4.0, "b"], [5.0, "c"]])
    with pytest.raises(ValueError, match=r"row 1 lacks column\(s\) \['w'\]"):
        TabularEncoder(numeric=["h", "w"]).fit([{"h": 1, "w": 2}, {"h": 3}])
    tok = mmte.tokenizers.create("tabular", dim=32, num_numeric=2, cardinalities=(3,))
    with pytest.raises(ValueError, match=r"numeric \[B, 2\]"):
        tok(numeric=torch.zeros(4, 3), categorical=torch.zeros(4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"categorical code 3 in row 1, column 0 is outside \[-1, 3\)"):
        tok(numeric=torch.zeros(2, 2), categorical=torch.tensor([[0], [3]]))


def test_unknown_modality_lists_registered():
    with pytest.raises(ValueError, match=r"unknown modality 'smell', expected one of audio, .*video, xray, see mmte list modalities \(to add one: docs/extending.md\)$"):
        mmte.tokenizers.create("smell", dim=32)
    with pytest.raises(KeyError, match=r"^unknown modality 'smell', expected one of audio, "):  # also a KeyError for dict-like callers
        mmte.get_modality("smell")
    with pytest.raises(ValueError, match="unknown modality 'smell'"):
        mmte.MetaTransformer({"smell": "smell"}, "tiny")


def test_unknown_option_lists_fields():
    with pytest.raises(ValueError, match=r"unknown audio tokenizer option\(s\) \['mel_bins'\], expected some of \['num_mel_bins', .*\] \(did you mean 'num_mel_bins'\?\)"):
        mmte.tokenizers.create("audio", dim=32, mel_bins=64)


def test_short_and_long_inputs():
    audio = mmte.tokenizers.create("audio", dim=32, max_frames=200)
    with pytest.raises(ValueError, match="10 frames; at least patch_size=16"):
        audio(torch.zeros(1, 10, 128))
    with pytest.raises(ValueError, match="300 frames; this tokenizer takes at most max_frames=200"):
        audio(torch.zeros(1, 300, 128))
    ts = mmte.tokenizers.create("time_series", dim=32)
    with pytest.raises(ValueError, match="NaN/inf"):
        ts(torch.full((1, 64, 2), float("nan")))


def test_graph_edge_out_of_range():
    tok = mmte.tokenizers.create("graph", dim=32, node_dim=2, num_eigvecs=2)
    with pytest.raises(ValueError, match=r"edge 1 of graph 0 is \[1, 5\]"):
        tok(torch.zeros(1, 3, 2), torch.tensor([[[0, 1], [1, 5]]]), torch.zeros(1, 3, 2))


def test_config_dataclass_per_modality():
    import dataclasses

    for name in mmte.list_modalities():
        spec = mmte.get_modality(name)
        assert dataclasses.is_dataclass(spec.config), name
        fields = {f.name: f.default for f in dataclasses.fields(spec.config)}
        assert "dim" not in fields and "device" not in fields, name
        # the example config is a valid config
        spec.make_config(**spec.example_config)
    fields = {f.name: f.default for f in dataclasses.fields(mmte.get_modality("audio").config)}
    assert fields["num_mel_bins"] == 128 and fields["patch_size"] == 16 and fields["stride"] == 10


@pytest.mark.parametrize("patch_size", [0, -4, (4, 0)])
def test_non_positive_patch_size(patch_size):
    with pytest.raises(ValueError) as e:
        mmte.tokenizers.create("image", dim=32, img_size=8, patch_size=patch_size, in_chans=1)
    assert str(e.value) == f"patch_size must be positive; got {patch_size!r}"
