"""Graph preprocessing for the TokenGT-style tokenizer: Laplacian eigenvector node identifiers and padding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .collate import pad_stack

__all__ = ["collate_graphs", "example_graph", "laplacian_eigvecs", "preprocess_graph"]


def laplacian_eigvecs(num_nodes: int, edge_index: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` eigenvectors of the symmetric normalised Laplacian ``I - D^-1/2 A D^-1/2`` with the
    smallest eigenvalues -> ``[num_nodes, k]`` (zero columns when ``k > num_nodes``). Edges are
    treated as undirected; isolated nodes have degree 0 and a unit diagonal."""
    a = torch.zeros(num_nodes, num_nodes, dtype=torch.float64)
    if edge_index.numel():
        a[edge_index[:, 0], edge_index[:, 1]] = 1.0
        a[edge_index[:, 1], edge_index[:, 0]] = 1.0
    a.fill_diagonal_(0.0)
    deg = a.sum(1)
    inv = torch.where(deg > 0, deg.rsqrt(), torch.zeros_like(deg))
    lap = torch.eye(num_nodes, dtype=torch.float64) - inv[:, None] * a * inv[None]
    _, vec = torch.linalg.eigh(lap)
    out = torch.zeros(num_nodes, k, dtype=torch.float32)
    m = min(k, num_nodes)
    out[:, :m] = vec[:, :m].float()
    return out


def preprocess_graph(
    node_features,
    edge_index,
    edge_features=None,
    num_eigvecs: int = 8,
) -> dict[str, torch.Tensor]:
    """One graph -> ``{"node_features": [N, Fn], "edge_index": [E, 2], "edge_features": [E, Fe], "eigvecs": [N, k]}``.

    Raises:
        ValueError: for shapes that do not fit, or edge endpoints outside ``[0, N)``.
    """
    x = torch.as_tensor(np.asarray(node_features), dtype=torch.float32)
    if x.dim() == 1:
        x = x[:, None]
    if x.dim() != 2 or x.shape[0] < 1:
        raise ValueError(f"node_features must be [N, F] with N >= 1; got shape {tuple(x.shape)}")
    e = torch.as_tensor(np.asarray(edge_index), dtype=torch.long).reshape(-1, 2) if len(edge_index) else torch.zeros(0, 2, dtype=torch.long)
    n = x.shape[0]
    if e.numel() and (int(e.min()) < 0 or int(e.max()) >= n):
        raise ValueError(f"edge endpoints must be in [0, {n}) for a graph of {n} nodes; got range [{int(e.min())}, {int(e.max())}]")
    out = {"node_features": x, "edge_index": e, "eigvecs": laplacian_eigvecs(n, e, num_eigvecs)}
    if edge_features is not None:
        ef = torch.as_tensor(np.asarray(edge_features), dtype=torch.float32)
        if ef.dim() == 1:
            ef = ef[:, None]
        if ef.shape[0] != e.shape[0]:
            raise ValueError(f"edge_features has {ef.shape[0]} rows; expected one per edge ({e.shape[0]})")
        out["edge_features"] = ef
    return out


def collate_graphs(samples: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad graphs -> ``node_features [B, N, Fn]``, ``num_nodes [B]``, ``edge_index [B, E, 2]``,
    ``num_edges [B]``, ``eigvecs [B, N, k]`` and ``edge_features [B, E, Fe]`` when present."""
    if not samples:
        raise ValueError("cannot collate an empty list of graphs")
    keys = set(samples[0])
    for i, s in enumerate(samples):
        if set(s) != keys:
            raise ValueError(f"graph {i} has fields {sorted(s)}; expected {sorted(keys)} like graph 0")
    x, nn_ = pad_stack([s["node_features"] for s in samples], 0)
    ei, ne = pad_stack([s["edge_index"] for s in samples], 0, 0)
    ev, _ = pad_stack([s["eigvecs"] for s in samples], 0)
    out = {"node_features": x, "num_nodes": nn_, "edge_index": ei, "num_edges": ne, "eigvecs": ev}
    if "edge_features" in keys:
        out["edge_features"] = pad_stack([s["edge_features"] for s in samples], 0)[0]
    return out


def example_graph(size: int, seed: int, num_eigvecs: int = 8) -> dict[str, torch.Tensor]:
    """A small molecule-like graph (a ring with branches): 6 (size 0) or 14 (size 1) atoms; node
    features one-hot element (C/N/O) + degree, edge feature one-hot bond order (1/2)."""
    g = torch.Generator().manual_seed(seed)
    n = (6, 14)[size]
    ring = min(n, 6)
    edges = [(i, (i + 1) % ring) for i in range(ring)]
    for v in range(ring, n):
        edges.append((int(torch.randint(0, v, (1,), generator=g)), v))
    e = torch.tensor(edges, dtype=torch.long)
    elem = torch.randint(0, 3, (n,), generator=g)
    deg = torch.bincount(e.flatten(), minlength=n).float()
    x = torch.cat([torch.nn.functional.one_hot(elem, 3).float(), deg[:, None] / 4], 1)
    order = torch.randint(0, 2, (len(edges),), generator=g)
    ef = torch.nn.functional.one_hot(order, 2).float()
    return preprocess_graph(x, e, ef, num_eigvecs)
