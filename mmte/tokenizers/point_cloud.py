"""Point-cloud tokenizer (Point-BERT / Point-MAE style, the Meta-Transformer design).

1. Farthest point sampling picks ``num_groups`` centres (deterministically from each cloud's first point).
2. Each centre's ``group_size`` nearest points form a group, expressed relative to the centre.
3. A small shared PointNet embeds each group: per-point MLP -> max-pool -> concatenate the pooled
   feature to every point -> MLP -> max-pool -> ``[B, G, D]``. (LayerNorm instead of BatchNorm, so a
   sample's tokens do not depend on the rest of the batch.)
4. An MLP of the centre coordinates is the position embedding; a cls token is prepended.

Padded clouds (``num_points``) are handled: padded points are never sampled nor grouped.
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.point_cloud import collate_points, example_points, preprocess_points
from .base import ModalityTokenizer, TokenSeq
from .registry import register_modality

__all__ = ["PointCloudTokenizer", "farthest_point_sample", "gather_points", "knn"]


def _valid(num_points: torch.Tensor | None, b: int, p: int, device) -> torch.Tensor | None:
    if num_points is None:
        return None
    return torch.arange(p, device=device)[None] < num_points.to(device)[:, None]


def farthest_point_sample(xyz: torch.Tensor, n: int, num_points: torch.Tensor | None = None) -> torch.Tensor:
    """Indices ``[B, n]`` of ``n`` farthest-point samples of ``xyz`` ``[B, P, 3]``.

    Starts from point 0; each step takes the point with the largest squared distance to the set
    chosen so far. Points at index ``>= num_points[b]`` are ignored.
    """
    b, p, _ = xyz.shape
    valid = _valid(num_points, b, p, xyz.device)
    counts = num_points if num_points is not None else torch.full((b,), p)
    if n > int(counts.min()):
        raise ValueError(f"cannot sample {n} centres from a cloud with {int(counts.min())} points; expected at least {n} points")
    xyz = xyz.float()
    dist = torch.full((b, p), float("inf"), device=xyz.device)
    if valid is not None:
        dist = dist.masked_fill(~valid, -1.0)
    idx = torch.zeros(b, n, dtype=torch.long, device=xyz.device)
    last = torch.zeros(b, dtype=torch.long, device=xyz.device)
    ar = torch.arange(b, device=xyz.device)
    for i in range(1, n):
        d = ((xyz - xyz[ar, last][:, None]) ** 2).sum(-1)
        dist = torch.minimum(dist, d) if valid is None else torch.where(valid, torch.minimum(dist, d), dist)
        last = dist.argmax(1)
        idx[:, i] = last
    return idx


def knn(query: torch.Tensor, xyz: torch.Tensor, k: int, num_points: torch.Tensor | None = None) -> torch.Tensor:
    """Indices ``[B, G, k]`` of the ``k`` nearest points of ``xyz`` ``[B, P, 3]`` to each query
    ``[B, G, 3]`` (nearest first); padded points (``>= num_points``) are excluded."""
    b, p, _ = xyz.shape
    counts = num_points if num_points is not None else torch.full((b,), p)
    if k > int(counts.min()):
        raise ValueError(f"group_size k={k} exceeds the {int(counts.min())} points of the smallest cloud; expected at least {k} points")
    # exact pairwise differences (no matmul expansion), so near neighbours keep their order
    d = torch.cdist(query.float(), xyz.float(), compute_mode="donot_use_mm_for_euclid_dist")  # [B, G, P]
    valid = _valid(num_points, b, p, xyz.device)
    if valid is not None:
        d = d.masked_fill(~valid[:, None], float("inf"))
    return d.topk(k, dim=-1, largest=False).indices


def gather_points(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, P, C]`` gathered at ``idx`` ``[B, ...]`` -> ``[B, ..., C]``."""
    b = x.shape[0]
    flat = idx.reshape(b, -1)
    out = x.gather(1, flat[..., None].expand(-1, -1, x.shape[-1]))
    return out.reshape(*idx.shape, x.shape[-1])


@register_modality(
    "point_cloud",
    preprocess=preprocess_points,
    collate=collate_points,
    default_head={"name": "classification", "pool": "max"},
    example=example_points,
    example_config={"num_groups": 16, "group_size": 16, "hidden": (32, 64)},
    variable_length=True,
    description="points {points [B, P, 3+F], num_points [B]}: FPS + kNN groups, shared mini-PointNet, MLP centre positions",
)
class PointCloudTokenizer(ModalityTokenizer):
    """Points ``[B, P, 3 + F]`` -> ``[cls] + num_groups`` group tokens.

    Args:
        dim: token width.
        num_groups: centres ``G`` (tokens).
        group_size: neighbours per group ``k``.
        in_chans: per-point channels (3 = xyz; 6 = xyz + normals/colours...). The first three are xyz.
        hidden: the PointNet's widths ``(h1, h2)``.
        cls_token: prepend a learned cls token (with its own learned position).
    """

    modality = "point_cloud"

    def __init__(
        self,
        dim: int,
        num_groups: int = 64,
        group_size: int = 32,
        in_chans: int = 3,
        hidden: tuple[int, int] = (128, 256),
        cls_token: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        if in_chans < 3:
            raise ValueError(f"point clouds need at least xyz (in_chans >= 3); got in_chans={in_chans}")
        self.num_groups, self.group_size, self.in_chans = num_groups, group_size, in_chans
        h1, h2 = hidden
        kw = {"device": device, "dtype": params_dtype}
        self.first = nn.Sequential(nn.Linear(in_chans, h1, **kw), nn.LayerNorm(h1, **kw), nn.GELU(), nn.Linear(h1, h2, **kw))
        self.second = nn.Sequential(nn.Linear(2 * h2, 2 * h2, **kw), nn.LayerNorm(2 * h2, **kw), nn.GELU(), nn.Linear(2 * h2, dim, **kw))
        self.pos = nn.Sequential(nn.Linear(3, 128, **kw), nn.GELU(), nn.Linear(128, dim, **kw))
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.cls_pos = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.num_prefix_tokens = int(cls_token)
        if self.pos[0].weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        for seq in (self.first, self.second, self.pos):
            for m in seq:
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
            nn.init.trunc_normal_(self.cls_pos, std=0.02)

    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_groups

    def group(self, points: torch.Tensor, num_points: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (groups ``[B, G, k, C]`` with xyz relative to the centre, centres ``[B, G, 3]``)."""
        xyz = points[..., :3]
        centre_idx = farthest_point_sample(xyz, self.num_groups, num_points)
        centres = gather_points(xyz, centre_idx)
        nb = knn(centres, xyz, self.group_size, num_points)
        groups = gather_points(points, nb)  # [B, G, k, C]
        rel = groups[..., :3] - centres[:, :, None]
        return torch.cat([rel, groups[..., 3:]], -1), centres

    def forward(self, points: torch.Tensor, num_points: torch.Tensor | None = None) -> TokenSeq:
        """Args:
            points: ``[B, P, in_chans]`` (padded).
            num_points: real points per cloud ``[B]`` (None: all ``P``).
        """
        if points.dim() != 3 or points.shape[-1] != self.in_chans:
            raise ValueError(f"point_cloud tokenizer expects points [B, P, {self.in_chans}]; got shape {tuple(points.shape)}")
        b, p, _ = points.shape
        if num_points is not None and tuple(num_points.shape) != (b,):
            raise ValueError(f"num_points must be [B={b}]; got shape {tuple(num_points.shape)}")
        if not bool(torch.isfinite(points if num_points is None else points[_valid(num_points, b, p, points.device)]).all()):
            raise ValueError("point cloud holds non-finite coordinates; expected finite values")
        groups, centres = self.group(points, num_points)
        dt = self.first[0].weight.dtype
        f = self.first(groups.to(dt))  # [B, G, k, h2]
        g = f.amax(2, keepdim=True).expand_as(f)
        tokens = self.second(torch.cat([g, f], -1)).amax(2)  # [B, G, D]
        x = tokens + self.pos(centres.to(dt))
        if self.cls_token is not None:
            x = torch.cat([(self.cls_token + self.cls_pos).expand(b, -1, -1), x], 1)
        return TokenSeq(x, None, self.num_prefix_tokens, positions=centres)
