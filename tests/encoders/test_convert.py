"""Reading a weights file (``mmte.encoders.convert.load_state_dict_file``): a missing, malformed or truncated file
and non-finite weights are each named in one line, before anything is built from them."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mmte.encoders.convert import load_state_dict_file
from mmte.errors import NonFiniteError, UsageError


def test_a_complete_file_reads_back(tmp_path):
    sd = {"a.weight": torch.randn(3, 4), "a.bias": torch.zeros(3)}
    save_file(sd, str(tmp_path / "w.safetensors"))
    torch.save({"state_dict": sd}, tmp_path / "w.pt")
    for name in ("w.safetensors", "w.pt"):
        got = load_state_dict_file(tmp_path / name)
        assert sorted(got) == sorted(sd) and all(torch.equal(got[k], sd[k]) for k in sd), name


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^checkpoint file not found: .*nope\.safetensors$"):
        load_state_dict_file(tmp_path / "nope.safetensors")


@pytest.mark.parametrize("name, data", [("bad.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json"), ("cut.pt", b"PK\x03\x04 cut")],
                         ids=["malformed-safetensors", "truncated-torch-save"])
def test_malformed_or_truncated_file(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    kind = "safetensors" if name.endswith(".safetensors") else "torch.save"
    with pytest.raises(UsageError) as e:
        load_state_dict_file(path)
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith(f"weights file {path} is malformed or truncated (")
    assert f"expected a complete {kind} file of tensors" in line and "replace it (e.g. write it again with mmte convert)" in line
    if kind == "safetensors":
        assert "(SafetensorError: Error while deserializing header: invalid header length)" in line, line


def test_non_finite_weight_is_named(tmp_path):
    w = torch.zeros(6, 4)
    w[1, 3] = float("nan")
    save_file({"ok": torch.ones(2), "layers.1.w": w}, str(tmp_path / "nan.safetensors"))
    with pytest.raises(NonFiniteError) as e:
        load_state_dict_file(tmp_path / "nan.safetensors")
    assert str(e.value).startswith(f"weights file {tmp_path / 'nan.safetensors'}: tensor 'layers.1.w' [6, 4] holds 1 non-finite "
                                   "value(s) (first: nan at flat index 7)")
    assert "expected finite weights" in str(e.value) and "use an intact copy of the weights" in str(e.value)
    assert load_state_dict_file(tmp_path / "nan.safetensors", check_finite=False)["layers.1.w"].isnan().sum() == 1
