"""Graph tokenizer (TokenGT, Kim et al. 2022): every node and every edge is a token.

Node ``v``: ``W_x x_v + W_id [P_v, P_v] + E_node``; edge ``(u, v)``: ``W_e e_uv + W_id [P_u, P_v] + E_edge``,
where ``P`` are Laplacian-eigenvector node identifiers (``mmte.data.graph.laplacian_eigvecs``) and
``E_node``/``E_edge`` learned type embeddings. A graph cls token is prepended. Token order:
``[cls, nodes (padded to N), edges (padded to E)]`` with the padding masked.
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.graph import collate_graphs, example_graph, preprocess_graph
from .base import ModalityTokenizer, TokenSeq, prepend_cls
from .registry import register_modality

__all__ = ["GraphTokenizer"]


@register_modality(
    "graph",
    preprocess=preprocess_graph,
    collate=collate_graphs,
    default_head={"name": "classification", "pool": "cls"},
    example=example_graph,
    example_config={"node_dim": 4, "edge_dim": 2, "num_eigvecs": 8},
    variable_length=True,
    description="graphs {node_features, edge_index, eigvecs, num_nodes, num_edges[, edge_features]}: TokenGT node + edge tokens",
)
class GraphTokenizer(ModalityTokenizer):
    """Padded graphs -> ``[cls] + N + E`` node and edge tokens.

    Args:
        dim: token width.
        node_dim: node feature width ``Fn``.
        edge_dim: edge feature width ``Fe`` (0: edges carry no features).
        num_eigvecs: Laplacian eigenvectors per node identifier ``k``.
        cls_token: prepend a graph token.
        sign_flip: randomly flip eigenvector signs in training (TokenGT's augmentation).
    """

    modality = "graph"

    def __init__(
        self,
        dim: int,
        node_dim: int = 16,
        edge_dim: int = 0,
        num_eigvecs: int = 8,
        cls_token: bool = True,
        sign_flip: bool = False,
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        self.node_dim, self.edge_dim, self.num_eigvecs, self.sign_flip = node_dim, edge_dim, num_eigvecs, sign_flip
        kw = {"device": device, "dtype": params_dtype}
        self.node_proj = nn.Linear(node_dim, dim, **kw)
        self.edge_proj = nn.Linear(edge_dim, dim, **kw) if edge_dim else None
        self.id_proj = nn.Linear(2 * num_eigvecs, dim, bias=False, **kw)
        self.type_embed = nn.Parameter(torch.empty(2, dim, **kw))
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.num_prefix_tokens = int(cls_token)
        if self.type_embed.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in (self.node_proj, self.edge_proj, self.id_proj):
            if m is not None:
                m.reset_parameters()
        nn.init.trunc_normal_(self.type_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def num_tokens(self, num_nodes: int, num_edges: int) -> int:
        return self.num_prefix_tokens + num_nodes + num_edges

    def forward(
        self,
        node_features: torch.Tensor,
        edge_index: torch.Tensor,
        eigvecs: torch.Tensor,
        num_nodes: torch.Tensor | None = None,
        num_edges: torch.Tensor | None = None,
        edge_features: torch.Tensor | None = None,
    ) -> TokenSeq:
        """Args:
            node_features: ``[B, N, node_dim]``; edge_index: ``[B, E, 2]`` long; eigvecs: ``[B, N, k]``;
            num_nodes / num_edges: ``[B]`` real counts (None: all); edge_features: ``[B, E, edge_dim]``.
        """
        if node_features.dim() != 3 or node_features.shape[-1] != self.node_dim:
            raise ValueError(f"graph tokenizer expects node_features [B, N, {self.node_dim}]; got shape {tuple(node_features.shape)}")
        b, n, _ = node_features.shape
        if edge_index.dim() != 3 or edge_index.shape[0] != b or edge_index.shape[-1] != 2 or edge_index.is_floating_point():
            raise ValueError(f"graph tokenizer expects edge_index [B={b}, E, 2] integers; got {edge_index.dtype} {tuple(edge_index.shape)}")
        if tuple(eigvecs.shape) != (b, n, self.num_eigvecs):
            raise ValueError(f"eigvecs must be [B, N, k] = {(b, n, self.num_eigvecs)}; got {tuple(eigvecs.shape)}")
        e = edge_index.shape[1]
        ar = torch.arange(n, device=node_features.device)
        node_mask = ar[None] < num_nodes[:, None] if num_nodes is not None else torch.ones(b, n, dtype=torch.bool, device=ar.device)
        edge_mask = (
            torch.arange(e, device=ar.device)[None] < num_edges[:, None] if num_edges is not None else torch.ones(b, e, dtype=torch.bool, device=ar.device)
        )
        ei = edge_index.long()
        bad = edge_mask[..., None] & ((ei < 0) | (ei >= (num_nodes[:, None, None] if num_nodes is not None else n)))
        if bool(bad.any()):
            gi, ej = (int(v) for v in bad.any(-1).nonzero()[0])
            raise ValueError(f"edge {ej} of graph {gi} is {ei[gi, ej].tolist()}; endpoints must be real nodes of that graph")
        ei = ei.clamp(0, max(n - 1, 0))
        dt = self.node_proj.weight.dtype
        p = eigvecs.to(dt)
        if self.sign_flip and self.training:
            p = p * (torch.randint(0, 2, (b, 1, self.num_eigvecs), device=p.device) * 2 - 1).to(dt)
        nodes = self.node_proj(node_features.to(dt)) + self.id_proj(torch.cat([p, p], -1)) + self.type_embed[0]
        pu = p.gather(1, ei[..., 0:1].expand(-1, -1, self.num_eigvecs))
        pv = p.gather(1, ei[..., 1:2].expand(-1, -1, self.num_eigvecs))
        edges = self.id_proj(torch.cat([pu, pv], -1)) + self.type_embed[1]
        if self.edge_proj is not None:
            if edge_features is None or tuple(edge_features.shape) != (b, e, self.edge_dim):
                raise ValueError(f"graph tokenizer expects edge_features [B, E, {self.edge_dim}] = {(b, e, self.edge_dim)}; got {getattr(edge_features, 'shape', None)}")
            edges = edges + self.edge_proj(edge_features.to(dt))
        x = torch.cat([nodes, edges], 1)
        mask = torch.cat([node_mask, edge_mask], 1)
        x, mask = prepend_cls(self.cls_token, x, mask)
        return TokenSeq(x, mask, self.num_prefix_tokens, extras={"num_node_tokens": n})
