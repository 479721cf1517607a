"""Farthest point sampling and kNN grouping against independent references."""

from __future__ import annotations

import pytest
import torch

from mmte.tokenizers.point_cloud import PointCloudTokenizer, farthest_point_sample, gather_points, knn


def brute_force_fps(xyz: torch.Tensor, n: int) -> list[int]:
    """The definition, one cloud at a time: start at point 0, then repeatedly take the point whose
    distance to its nearest already-chosen point is largest."""
    chosen = [0]
    for _ in range(n - 1):
        best, best_d = -1, -1.0
        for i in range(xyz.shape[0]):
            d = min(float(((xyz[i] - xyz[j]) ** 2).sum()) for j in chosen)
            if d > best_d:
                best, best_d = i, d
        chosen.append(best)
    return chosen


def test_fps_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    xyz = torch.randn(3, 60, 3, generator=g, dtype=torch.float64)
    got = farthest_point_sample(xyz, 12)
    for b in range(3):
        assert got[b].tolist() == brute_force_fps(xyz[b], 12)


def test_fps_ignores_padding():
    g = torch.Generator().manual_seed(2)
    xyz = torch.randn(2, 80, 3, generator=g)
    xyz[0, 50:] = 100.0  # far-away padding would be picked first if it were not masked
    got = farthest_point_sample(xyz, 10, num_points=torch.tensor([50, 80]))
    assert got[0].tolist() == brute_force_fps(xyz[0, :50].double(), 10)
    assert got[1].tolist() == brute_force_fps(xyz[1].double(), 10)
    assert int(got[0].max()) < 50


def test_knn_matches_cdist():
    g = torch.Generator().manual_seed(3)
    xyz = torch.randn(2, 100, 3, generator=g)
    q = torch.randn(2, 7, 3, generator=g)
    idx = knn(q, xyz, 9)
    ref = torch.cdist(q, xyz).topk(9, dim=-1, largest=False).indices
    assert torch.equal(idx.sort(-1).values, ref.sort(-1).values)
    # nearest first
    d = torch.cdist(q, xyz).gather(-1, idx)
    assert bool((d[..., 1:] >= d[..., :-1]).all())


def test_knn_excludes_padding():
    g = torch.Generator().manual_seed(4)
    xyz = torch.randn(1, 40, 3, generator=g)
    xyz[0, 30:] = 0.0  # padded points at the origin, near the query
    q = torch.zeros(1, 1, 3)
    idx = knn(q, xyz, 5, num_points=torch.tensor([30]))
    ref = torch.cdist(q, xyz[:, :30]).topk(5, dim=-1, largest=False).indices
    assert torch.equal(idx.sort(-1).values, ref.sort(-1).values)


def test_groups_are_centred_neighbourhoods():
    g = torch.Generator().manual_seed(5)
    pts = torch.randn(2, 128, 6, generator=g)
    tok = PointCloudTokenizer(32, num_groups=8, group_size=16, in_chans=6, hidden=(16, 32))
    groups, centres = tok.group(pts)
    assert groups.shape == (2, 8, 16, 6) and centres.shape == (2, 8, 3)
    idx = farthest_point_sample(pts[..., :3], 8)
    torch.testing.assert_close(centres, gather_points(pts[..., :3], idx))
    # the nearest neighbour of each centre is the centre itself: relative xyz zero, features kept
    torch.testing.assert_close(groups[:, :, 0, :3], torch.zeros(2, 8, 3))
    torch.testing.assert_close(groups[:, :, 0, 3:], gather_points(pts[..., 3:], idx))


def test_tokens_invariant_to_point_order_except_start():
    """Permuting all points but the first (FPS's start) leaves the tokens unchanged."""
    g = torch.Generator().manual_seed(6)
    pts = torch.randn(1, 200, 3, generator=g)
    perm = torch.cat([torch.zeros(1, dtype=torch.long), torch.randperm(199, generator=g) + 1])
    tok = PointCloudTokenizer(32, num_groups=16, group_size=8, hidden=(16, 32)).eval()
    a, b = tok(pts).tokens, tok(pts[:, perm]).tokens
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_too_few_points():
    tok = PointCloudTokenizer(32, num_groups=16, group_size=32, hidden=(16, 32))
    with pytest.raises(ValueError, match="group_size k=32 exceeds the 20 points"):
        tok(torch.randn(1, 20, 3))
    with pytest.raises(ValueError, match="cannot sample 16 centres from a cloud with 10 points"):
        PointCloudTokenizer(32, num_groups=16, group_size=4, hidden=(16, 32))(torch.randn(1, 10, 3))
