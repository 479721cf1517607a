"""Token counts against the patch-grid formulas (and the published figures where there is one)."""

from __future__ import annotations

import pytest
import torch

import mmte
from mmte.data.graph import collate_graphs, example_graph


def n_tokens(modality, value, **cfg):
    tok = mmte.tokenizers.create(modality, dim=32, **cfg)
    seq = tok(**value) if isinstance(value, dict) else tok(value)
    return seq.num_tokens, tok


@pytest.mark.parametrize("h,w", [(32, 32), (48, 80)])
@pytest.mark.parametrize("modality,chans", [("image", 3), ("infrared", 1), ("xray", 1)])
def test_image_grid(modality, chans, h, w):
    n, tok = n_tokens(modality, torch.zeros(1, chans, h, w), img_size=32, patch_size=16)
    assert n == 1 + (h // 16) * (w // 16) == tok.num_tokens(h, w)


@pytest.mark.parametrize("frames", [16, 100, 1024])
def test_audio_ast_grid(frames):
    n, tok = n_tokens("audio", {"fbank": torch.zeros(1, frames, 128)})
    f_grid, t_grid = (128 - 16) // 10 + 1, (frames - 16) // 10 + 1
    assert n == 1 + f_grid * t_grid == tok.num_tokens(frames)
    if frames == 1024:
        assert n - 1 == 1212  # AST's 12 x 101 patches for a 10.24 s clip


def test_video_tubelets():
    n, tok = n_tokens("video", {"video": torch.zeros(1, 3, 16, 224, 224)}, img_size=224, max_frames=16)
    assert n == 1 + (16 // 2) * 14 * 14 == 1 + 1568 == tok.num_tokens(16, 224, 224)


@pytest.mark.parametrize("length,expected", [(336, 42), (512, 64), (96, 12)])
def test_time_series_patchtst(length, expected):
    # PatchTST (patch 16, stride 8, end padding): 336 -> 42 patches, 512 -> 64
    n, tok = n_tokens("time_series", torch.randn(2, length, 7), num_channels=7)
    assert n == expected == (length - 16) // 8 + 2 == tok.num_patches(length)


@pytest.mark.parametrize("bands,g,s", [(200, 4, 4), (103, 4, 4), (144, 6, 3), (3, 4, 2)])
def test_hyperspectral_groups(bands, g, s):
    import math

    n, tok = n_tokens("hyperspectral", torch.randn(1, bands, 7, 7), group_size=g, group_stride=s)
    assert n == 1 + math.ceil(max(bands - g, 0) / s) + 1 == tok.num_tokens(bands)
    if (bands, g, s) == (200, 4, 4):
        assert n == 51  # Indian Pines' 200 bands in groups of 4


@pytest.mark.parametrize("length", [10, 2000, 2005])
def test_imu_windows(length):
    n, tok = n_tokens("imu", {"imu": torch.randn(1, length, 6)}, max_windows=256)
    assert n == 1 + (length - 10) // 10 + 1 == tok.num_tokens(length)


def test_point_cloud_groups():
    n, tok = n_tokens("point_cloud", torch.randn(1, 1024, 3), num_groups=64, group_size=32, hidden=(16, 32))
    assert n == 65 == tok.num_tokens()


def test_tabular_columns():
    n, tok = n_tokens("tabular", {"numeric": torch.randn(2, 5), "categorical": torch.zeros(2, 3, dtype=torch.long)}, num_numeric=5, cardinalities=(2, 3, 4))
    assert n == 1 + 5 + 3 == tok.num_tokens()


def test_graph_nodes_and_edges():
    g0, g1 = example_graph(0, 0), example_graph(1, 1)
    n, tok = n_tokens("graph", collate_graphs([g0, g1]), node_dim=4, edge_dim=2)
    n_nodes, n_edges = g1["node_features"].shape[0], g1["edge_index"].shape[0]
    assert n == 1 + n_nodes + n_edges == tok.num_tokens(n_nodes, n_edges)


def test_text_ids():
    n, _ = n_tokens("text", {"input_ids": torch.ones(2, 17, dtype=torch.long)}, vocab_size=100)
    assert n == 17
