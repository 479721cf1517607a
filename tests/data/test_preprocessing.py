"""Preprocessing and collate functions of the other modalities."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch

from mmte.data import collate_batch
from mmte.data.graph import laplacian_eigvecs, preprocess_graph
from mmte.data.hyperspectral import extract_patch
from mmte.data.image import preprocess_image
from mmte.data.imu import preprocess_imu
from mmte.data.point_cloud import normalize_points, preprocess_points
from mmte.data.tabular import TabularEncoder, collate_tabular
from mmte.data.time_series import ETT_HOURLY_BORDERS, sliding_windows
from mmte.data.video import preprocess_video, sample_frame_indices
from mmte.tokenizers.registry import collate_modalities


def test_image_preprocess_matches_manual():
    img = (np.arange(20 * 30 * 3) % 256).astype(np.uint8).reshape(20, 30, 3)
    out = preprocess_image(img, size=None, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    ref = (torch.from_numpy(img).permute(2, 0, 1).float() / 255 - 0.5) / 0.25
    torch.testing.assert_close(out, ref)
    grey = preprocess_image(img, size=16, mean=None, std=None, channels=1)
    assert grey.shape == (1, 16, 16)


def test_laplacian_eigvecs_against_networkx():
    g = nx.cycle_graph(7)
    g.add_edge(0, 3)
    edges = torch.tensor(list(g.edges()))
    vec = laplacian_eigvecs(7, edges, 4).double()
    lap = torch.from_numpy(nx.normalized_laplacian_matrix(g, nodelist=range(7)).toarray())
    vals = torch.linalg.eigvalsh(lap)[:4]
    # eigenvectors of networkx's normalised Laplacian with the 4 smallest eigenvalues, orthonormal
    torch.testing.assert_close(lap @ vec, vec * vals, rtol=0, atol=1e-5)
    torch.testing.assert_close(vec.t() @ vec, torch.eye(4, dtype=torch.float64), rtol=0, atol=1e-5)
    small = laplacian_eigvecs(3, torch.tensor([[0, 1], [1, 2]]), 5)
    assert small.shape == (3, 5) and small[:, 3:].abs().sum() == 0


def test_graph_preprocess_rejects_bad_edges():
    with pytest.raises(ValueError, match=r"edge endpoints must be in \[0, 3\)"):
        preprocess_graph(torch.zeros(3, 2), [[0, 1], [2, 3]])


def test_point_preprocess_unit_sphere():
    pts = torch.randn(500, 6) * 5 + 3
    out = preprocess_points(pts, num_points=256)
    assert out.shape == (256, 6)
    torch.testing.assert_close(out[:, :3].mean(0), torch.zeros(3), rtol=0, atol=1e-5)
    assert math.isclose(float(out[:, :3].norm(dim=1).max()), 1.0, rel_tol=1e-5)
    with pytest.raises(ValueError, match="has 100 points; at least num_points=256"):
        preprocess_points(torch.randn(100, 3), num_points=256)
    with pytest.raises(ValueError, match="non-finite"):
        normalize_points(preprocess_points(torch.tensor([[0.0, float("nan"), 1.0]])))


def test_tabular_encoder_standardises_and_codes():
    rows = [[1.0, "red", 10], [3.0, "blue", None], [None, "red", 30], [5.0, "", 20]]
    enc = TabularEncoder(numeric=[0, 2], categorical=[1]).fit(rows)
    assert enc.cardinalities == (2,)
    out = enc(rows + [[2.0, "green", 20]])
    num = torch.stack([o["numeric"] for o in out])
    ref0 = (torch.tensor([1.0, 3.0, 5.0, 2.0]) - 3.0) / math.sqrt(8 / 3)
    torch.testing.assert_close(num[[0, 1, 3, 4], 0], ref0)
    assert math.isnan(num[2, 0]) and math.isnan(num[1, 1])
    cats = [int(o["categorical"][0]) for o in out]
    assert cats == [0, 1, 0, -1, -1]  # "" missing, unseen "green" -> missing
    batch = collate_tabular(out)
    assert batch["numeric"].shape == (5, 2) and batch["categorical"].shape == (5, 1)


def test_sliding_windows_and_ett_borders():
    s = torch.arange(30.0)[:, None].repeat(1, 2)
    x, y = sliding_windows(s, 8, 4, step=3)
    assert x.shape == (7, 8, 2) and y.shape == (7, 4, 2)
    assert x[1, 0, 0] == 3 and y[1, 0, 0] == 11 and y[1, -1, 1] == 14
    assert ETT_HOURLY_BORDERS == (0, 8640, 11520, 14400)


def test_video_sampling_and_layout():
    frames = np.random.default_rng(0).integers(0, 255, (10, 20, 20, 3), dtype=np.uint8)
    out = preprocess_video(frames, num_frames=4, size=16, mean=None, std=None)
    assert out.shape == (3, 4, 16, 16)
    assert sample_frame_indices(10, 4).tolist() == [1, 3, 6, 8]


def test_imu_resample_with_torchaudio():
    t = torch.arange(200) / 100
    x = torch.stack([torch.sin(2 * math.pi * 2 * t), torch.cos(2 * math.pi * 3 * t)], 1)
    out = preprocess_imu(x, 100, 50)
    assert out.shape == (100, 2)
    t2 = torch.arange(100) / 50
    ref = torch.stack([torch.sin(2 * math.pi * 2 * t2), torch.cos(2 * math.pi * 3 * t2)], 1)
    torch.testing.assert_close(out[10:-10], ref[10:-10], rtol=0, atol=2e-2)  # away from the edges


def test_hyperspectral_patch_reflects():
    img = torch.arange(2 * 5 * 5, dtype=torch.float32).reshape(2, 5, 5)
    p = extract_patch(img, 0, 0, 3)
    assert p.shape == (2, 3, 3) and p[0, 1, 1] == img[0, 0, 0] and p[0, 0, 0] == img[0, 1, 1]


def test_collate_modalities_uses_registry():
    samples = [{"audio": torch.randn(20 + 5 * i, 128), "label": i} for i in range(3)]
    batch = collate_modalities(samples)
    assert batch["audio"]["fbank"].shape == (3, 30, 128) and batch["label"].tolist() == [0, 1, 2]
    assert batch["audio"]["frames"].tolist() == [20, 25, 30]
    torch.testing.assert_close(batch["audio"]["fbank"][0, :20], samples[0]["audio"], rtol=0, atol=0)
    assert batch["audio"]["fbank"][0, 20:].abs().sum() == 0  # padding
    with pytest.raises(ValueError, match="sample 1 has keys"):
        collate_modalities([{"audio": torch.randn(20, 128), "label": 0}, {"label": 1}])


def test_collate_batch_without_collates_stacks():
    """mmte.data knows no modality registry: without a collate, same-shape tensors are stacked and
    different shapes are refused with the sample named."""
    batch = collate_batch([{"x": torch.full((2,), float(i)), "label": i} for i in range(3)])
    assert batch["x"].tolist() == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]] and batch["label"].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"^audio sample 1 has shape \(25, 128\); expected \(20, 128\) like sample 0"):
        collate_batch([{"audio": torch.randn(20, 128)}, {"audio": torch.randn(25, 128)}])
