"""Tabular tokenizer: one token per column (FT-Transformer's feature tokenizer).

* numeric column ``j``: ``x_j * W_j + b_j`` (``numeric_embedding: linear``, a learned direction and
  offset per column), or ``numeric_embedding: periodic``: ``ReLU(Linear_j([sin(2 pi c_j x_j),
  cos(2 pi c_j x_j)]))`` with ``k`` learned frequencies ``c_j`` per column (initialised from
  ``N(0, frequency_scale^2)``), the PLR embedding of Gorishniy et al. 2022 ("On Embeddings for
  Numerical Features in Tabular Deep Learning"): a token that can change non-monotonically with the
  value, which is what lets a transformer match gradient-boosted trees on GBDT-friendly tables. A
  missing value (NaN) takes the column's learned ``missing`` embedding instead;
* categorical column ``j``: a row of the column's own embedding table; code ``-1`` (missing or
  unseen) maps to the column's reserved "missing" row 0.

A cls token is prepended. Column counts are fixed by the config; values come from
:class:`mmte.data.tabular.TabularEncoder`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..data.tabular import TabularEncoder, collate_tabular, example_tabular
from .base import ModalityTokenizer, TokenSeq, prepend_cls
from .registry import register_modality

__all__ = ["TabularTokenizer"]


@register_modality(
    "tabular",
    preprocess=TabularEncoder,
    collate=collate_tabular,
    default_head={"name": "classification", "pool": "cls"},
    example=example_tabular,
    example_config={"num_numeric": 4, "cardinalities": (3, 5)},
    description="rows {numeric [B, Cn] (NaN missing), categorical [B, Cc] (-1 missing)}: a token per column",
)
class TabularTokenizer(ModalityTokenizer):
    """``{"numeric": [B, Cn] float (NaN = missing), "categorical": [B, Cc] long (-1 = missing)}``
    -> ``[cls] + Cn + Cc`` column tokens.

    Args:
        dim: token width.
        num_numeric: numeric columns ``Cn``.
        cardinalities: categories per categorical column (excluding the missing code).
        cls_token: prepend a learned cls token.
        numeric_embedding: ``"linear"`` or ``"periodic"`` (see the module docstring).
        num_frequencies: periodic: frequencies ``k`` per column.
        frequency_scale: periodic: standard deviation of the initial frequencies (on the scaled values).
    """

    modality = "tabular"

    def __init__(
        self,
        dim: int,
        num_numeric: int = 0,
        cardinalities: tuple[int, ...] = (),
        cls_token: bool = True,
        numeric_embedding: str = "linear",
        num_frequencies: int = 16,
        frequency_scale: float = 0.1,
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        cardinalities = tuple(int(c) for c in cardinalities)
        if num_numeric < 0 or any(c < 1 for c in cardinalities) or num_numeric + len(cardinalities) == 0:
            raise ValueError(
                f"tabular tokenizer needs >= 1 column: num_numeric >= 0 and positive cardinalities; got {num_numeric}, {cardinalities}"
            )
        if numeric_embedding not in ("linear", "periodic"):
            raise ValueError(f"tabular tokenizer numeric_embedding must be 'linear' or 'periodic'; got {numeric_embedding!r}")
        if numeric_embedding == "periodic" and (not isinstance(num_frequencies, int) or num_frequencies < 1 or frequency_scale <= 0):
            raise ValueError(f"periodic embeddings need num_frequencies >= 1 and frequency_scale > 0; got {num_frequencies!r}, {frequency_scale!r}")
        self.num_numeric, self.cardinalities = num_numeric, cardinalities
        self.numeric_embedding, self.num_frequencies, self.frequency_scale = numeric_embedding, num_frequencies, frequency_scale
        kw = {"device": device, "dtype": params_dtype}
        k = num_frequencies if numeric_embedding == "periodic" else 0
        self.num_freq = nn.Parameter(torch.empty(num_numeric, k, **kw)) if k else None
        self.num_weight = nn.Parameter(torch.empty(num_numeric, 2 * k, dim, **kw) if k else torch.empty(num_numeric, dim, **kw))
        self.num_bias = nn.Parameter(torch.empty(num_numeric, dim, **kw))
        self.num_missing = nn.Parameter(torch.empty(num_numeric, dim, **kw))
        offsets = torch.tensor([0, *cardinalities[:-1]], dtype=torch.long).cumsum(0) + torch.arange(len(cardinalities))
        self.register_buffer("cat_offsets", offsets if cardinalities else torch.zeros(0, dtype=torch.long), persistent=False)
        self.cat_embed = nn.Embedding(sum(cardinalities) + len(cardinalities), dim, **kw) if cardinalities else None
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.num_prefix_tokens = int(cls_token)
        if self.num_weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.num_freq is not None:  # PLR: frequencies N(0, scale^2); the per-column Linear as nn.Linear inits it
            nn.init.normal_(self.num_freq, std=self.frequency_scale)
            bound = (2 * self.num_frequencies) ** -0.5
            nn.init.uniform_(self.num_weight, -bound, bound)
            nn.init.uniform_(self.num_bias, -bound, bound)
            nn.init.normal_(self.num_missing, std=self.dim**-0.5)
        else:
            for p in (self.num_weight, self.num_bias, self.num_missing):
                nn.init.normal_(p, std=self.dim**-0.5)
        if self.cat_embed is not None:
            nn.init.normal_(self.cat_embed.weight, std=self.dim**-0.5)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        # buffers are not restored by to_empty(); recompute them
        offsets = torch.tensor([0, *self.cardinalities[:-1]], dtype=torch.long).cumsum(0) + torch.arange(len(self.cardinalities))
        self.cat_offsets = offsets.to(self.num_weight.device) if self.cardinalities else torch.zeros(0, dtype=torch.long, device=self.num_weight.device)

    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_numeric + len(self.cardinalities)

    def forward(self, numeric: torch.Tensor | None = None, categorical: torch.Tensor | None = None) -> TokenSeq:
        """Args:
            numeric: ``[B, num_numeric]`` floats, NaN where missing.
            categorical: ``[B, len(cardinalities)]`` codes in ``[0, card)``, ``-1`` where missing.
        """
        parts, b = [], None
        if self.num_numeric:
            if numeric is None or numeric.dim() != 2 or numeric.shape[1] != self.num_numeric or not numeric.is_floating_point():
                raise ValueError(
                    f"tabular tokenizer expects numeric [B, {self.num_numeric}] floats; got {getattr(numeric, 'shape', None) if numeric is None else (numeric.dtype, tuple(numeric.shape))}"
                )
            b = numeric.shape[0]
            miss = torch.isnan(numeric)
            if bool(torch.isinf(numeric).any()):
                raise ValueError("numeric tabular values must be finite or NaN (missing); got inf")
            x = numeric.nan_to_num(0.0).to(self.num_weight.dtype)[..., None]
            if self.num_freq is None:
                tok = x * self.num_weight + self.num_bias
            else:
                angle = 2 * math.pi * x * self.num_freq  # [B, Cn, k]
                feats = torch.cat([torch.sin(angle), torch.cos(angle)], -1)  # [B, Cn, 2k]
                tok = torch.relu(torch.einsum("bnk,nkd->bnd", feats, self.num_weight) + self.num_bias)
            parts.append(torch.where(miss[..., None], self.num_missing.expand_as(tok), tok))
        elif numeric is not None and numeric.numel():
            raise ValueError(f"this tabular tokenizer has no numeric columns; got numeric of shape {tuple(numeric.shape)}")
        if self.cardinalities:
            c = len(self.cardinalities)
            if categorical is None or categorical.dim() != 2 or categorical.shape[1] != c or categorical.is_floating_point():
                raise ValueError(
                    f"tabular tokenizer expects categorical [B, {c}] integer codes; got {None if categorical is None else (categorical.dtype, tuple(categorical.shape))}"
                )
            if b is not None and categorical.shape[0] != b:
                raise ValueError(f"numeric and categorical batch sizes differ: {b} vs {categorical.shape[0]}")
            card = torch.tensor(self.cardinalities, device=categorical.device)
            bad = (categorical < -1) | (categorical >= card)
            if bool(bad.any()):
                r, j = (int(v) for v in bad.nonzero()[0])
                raise ValueError(
                    f"categorical code {int(categorical[r, j])} in row {r}, column {j} is outside [-1, {self.cardinalities[j]})"
                )
            b = categorical.shape[0]
            parts.append(self.cat_embed(categorical.long() + 1 + self.cat_offsets.to(categorical.device)))
        elif categorical is not None and categorical.numel():
            raise ValueError(f"this tabular tokenizer has no categorical columns; got categorical of shape {tuple(categorical.shape)}")
        x = torch.cat(parts, 1)
        x, _ = prepend_cls(self.cls_token, x, None)
        return TokenSeq(x, None, self.num_prefix_tokens)
