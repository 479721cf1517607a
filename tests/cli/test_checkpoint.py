"""``--ckpt_path`` files (``mmte.cli.checkpoint.load_checkpoint``): a missing or truncated file is refused in
one line naming it, with what was expected and what to do; a distributed checkpoint folder is left to the
strategy."""

from __future__ import annotations

import pytest
import torch

from mmte.cli.checkpoint import load_checkpoint
from mmte.errors import UsageError


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "checkpoints" / "best.ckpt"
    path.parent.mkdir()
    torch.save({"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"lr": 0.1}}, path)
    return path


def test_a_complete_checkpoint_and_a_folder(ckpt, tmp_path):
    got = load_checkpoint(str(ckpt), str(ckpt.parent))
    assert torch.equal(got["state_dict"]["w"], torch.ones(2)) and got["hyper_parameters"] == {"lr": 0.1}
    assert load_checkpoint(str(tmp_path), str(ckpt.parent)) is None  # a DCP folder: the strategy reads it


def test_missing_checkpoint(ckpt, tmp_path):
    with pytest.raises(UsageError) as e:
        load_checkpoint(str(tmp_path / "nope.ckpt"), str(tmp_path / "empty"))
    assert str(e.value) == (f"--ckpt_path {tmp_path / 'nope.ckpt'} does not exist, expected a checkpoint file written by mmte fit "
                            "(or best / last), run mmte fit first")
    with pytest.raises(UsageError) as e:  # a folder with checkpoints: they are offered
        load_checkpoint(str(tmp_path / "nope.ckpt"), str(ckpt.parent))
    assert str(e.value).endswith(f"pass one of ['best.ckpt'] in {ckpt.parent}")


def test_truncated_checkpoint(ckpt, tmp_path):
    cut = tmp_path / "truncated.ckpt"
    cut.write_bytes(ckpt.read_bytes()[:300])
    with pytest.raises(UsageError) as e:
        load_checkpoint(str(cut), str(ckpt.parent))
    assert str(e.value) == (f"--ckpt_path {cut} is not a complete checkpoint (truncated, or not written by torch.save; 300 bytes), "
                            f"expected a .ckpt file written by mmte fit, use another checkpoint (e.g. {ckpt}) or train again")
