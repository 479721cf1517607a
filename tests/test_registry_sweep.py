"""Registry sweep: every registered modality, built through the registry and MetaTransformer with its
default head on a tiny backbone, at two realistic input sizes."""

from __future__ import annotations

import pytest
import torch

import mmte
from mmte.tokenizers.registry import get_modality

from .tokenizers import contract

MODALITIES = mmte.list_modalities()


@pytest.fixture(autouse=True)
def _one_thread():
    """Many tiny forward/backward passes: intra-op threads only add spin-wait overhead here."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


BUILTINS = ["text", "image", "infrared", "xray", "hyperspectral", "audio", "video", "point_cloud", "tabular", "graph", "time_series", "imu"]


def test_builtins_registered():
    assert set(BUILTINS) <= set(MODALITIES), sorted(set(BUILTINS) - set(MODALITIES))
    for m in BUILTINS:
        spec = get_modality(m)
        assert spec.example is not None and spec.collate is not None and spec.preprocess is not None, m
        assert "name" in spec.default_head and spec.default_head["name"] in mmte.heads.list_heads()


@pytest.mark.parametrize("size", [0, 1])
@pytest.mark.parametrize("modality", MODALITIES)
def test_forward_shape_no_nan(modality, size):
    contract.check_forward_shape_no_nan(modality, size)


@pytest.mark.parametrize("policy", contract.POLICIES, ids=["backbone", "tokenizers", "none", "globs"])
@pytest.mark.parametrize("modality", MODALITIES)
def test_backward_reaches_exactly_trainable(modality, policy):
    contract.check_backward_reaches_exactly_trainable(modality, policy)


@pytest.mark.parametrize("modality", MODALITIES)
def test_meta_construction_and_reset(modality):
    contract.check_meta_construction_and_reset(modality)


@pytest.mark.parametrize("modality", MODALITIES)
def test_padding_is_masked(modality):
    contract.check_padding_is_masked(modality)
