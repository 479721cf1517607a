"""The built-in heads: classification, regression, forecasting, token-level and contrastive."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..seq import TokenSeq
from .base import POOLINGS, Head, masked_pool
from .registry import register_head

__all__ = ["ClassificationHead", "ContrastiveHead", "ForecastingHead", "RegressionHead", "TokenHead", "info_nce", "pool_sequence"]


def _mlp(dim: int, out: int, hidden: int | None, dropout: float, norm: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.LayerNorm(dim)] if norm else []
    if dropout:
        layers.append(nn.Dropout(dropout))
    if hidden:
        layers += [nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, out)]
    else:
        layers.append(nn.Linear(dim, out))
    return nn.Sequential(*layers)


def pool_sequence(hidden: torch.Tensor, seq: TokenSeq | None, pool: str) -> torch.Tensor:
    """Pool ``[B, N, D]`` to ``[B, D]`` honouring ``seq``'s mask and prefix tokens. Channel-independent
    sequences (``seq.extras["channels"] = C``: ``B*C`` sequences, e.g. time series) are pooled per
    sequence and then averaged over each sample's ``C`` channels."""
    mask = seq.mask if seq is not None else None
    prefix = seq.num_prefix_tokens if seq is not None else 0
    out = masked_pool(hidden, mask, pool, prefix)
    c = int(seq.extras.get("channels", 1)) if seq is not None else 1
    if c > 1:
        if out.shape[0] % c:
            raise ValueError(f"got {out.shape[0]} channel sequences, not a multiple of channels={c}")
        out = out.reshape(-1, c, out.shape[-1]).mean(1)
    return out


@register_head("classification")
class ClassificationHead(Head):
    """Pool the sequence, then LayerNorm + Linear (or a one-hidden-layer MLP) -> logits ``[B, C]``.

    Channel-independent inputs (time series: ``B*C`` sequences) are pooled per channel and averaged
    over the channels, so the output is still per sample.

    Args:
        dim: hidden width ``D``.
        num_classes: classes ``C``.
        pool: ``"cls"`` (first token), ``"mean"`` or ``"max"`` over real tokens (padding ignored).
        hidden: MLP hidden width (None: a single Linear).
        dropout: dropout before the classifier.
        norm: LayerNorm before the classifier.
        label_smoothing: cross-entropy label smoothing.
    """

    task = "classification"

    def __init__(
        self,
        dim: int,
        num_classes: int,
        pool: str = "mean",
        hidden: int | None = None,
        dropout: float = 0.0,
        norm: bool = True,
        label_smoothing: float = 0.0,
    ):
        super().__init__(dim)
        if pool not in POOLINGS:
            raise ValueError(f"pool must be one of {POOLINGS}; got {pool!r}")
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int; got {num_classes!r}")
        self.pool, self.num_classes, self.label_smoothing = pool, num_classes, label_smoothing
        self.mlp = _mlp(dim, num_classes, hidden, dropout, norm)

    def forward(self, hidden: torch.Tensor, seq: TokenSeq | None = None) -> torch.Tensor:
        self._check_hidden(hidden, seq, self.dim)
        return self.mlp(pool_sequence(hidden, seq, self.pool))

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if target is None or target.dim() != 1 or target.shape[0] != output.shape[0]:
            raise ValueError(f"classification target must be class ids [B={output.shape[0]}]; got {getattr(target, 'shape', target)}")
        return F.cross_entropy(output, target.long(), label_smoothing=self.label_smoothing)


@register_head("regression")
class RegressionHead(Head):
    """Pool, then LayerNorm + Linear -> ``[B, out_dim]``; loss ``"mse"``, ``"l1"`` or ``"huber"``.

    Args:
        dim: hidden width.
        out_dim: regression targets per sample.
        pool: ``"cls"``, ``"mean"`` or ``"max"``.
        hidden: optional MLP hidden width.
        loss_type: ``"mse"``, ``"l1"`` or ``"huber"``.
    """

    task = "regression"

    LOSSES = ("mse", "l1", "huber")

    def __init__(self, dim: int, out_dim: int = 1, pool: str = "mean", hidden: int | None = None, loss_type: str = "mse"):
        super().__init__(dim)
        if loss_type not in self.LOSSES:
            raise ValueError(f"loss_type must be one of {self.LOSSES}; got {loss_type!r}")
        if pool not in POOLINGS:
            raise ValueError(f"pool must be one of {POOLINGS}; got {pool!r}")
        self.out_dim, self.pool, self.loss_type = out_dim, pool, loss_type
        self.mlp = _mlp(dim, out_dim, hidden, 0.0, True)

    def forward(self, hidden: torch.Tensor, seq: TokenSeq | None = None) -> torch.Tensor:
        self._check_hidden(hidden, seq, self.dim)
        return self.mlp(pool_sequence(hidden, seq, self.pool))

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.to(output.dtype).reshape(output.shape) if target is not None and target.numel() == output.numel() else target
        if target is None or target.shape != output.shape:
            raise ValueError(f"regression target must have shape {tuple(output.shape)}; got {getattr(target, 'shape', target)}")
        fn = {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.smooth_l1_loss}[self.loss_type]
        return fn(output, target)


@register_head("forecasting")
class ForecastingHead(Head):
    """Multi-step forecasting from channel-independent patch tokens (PatchTST's flatten head).

    The time-series tokenizer encodes each of the ``C`` channels of ``B`` series as its own sequence,
    so the hidden states are ``[B*C, P, D]``. Each channel's ``P`` patch states are flattened and
    mapped to ``horizon`` future values, reshaped to ``[B, horizon, C]``, and the tokenizer's reversible
    instance normalisation is undone (``seq.extras["revin"]``), so predictions are in the input's scale;
    a seasonal cycle the tokenizer took out (``seq.extras["season"]``, its level at the forecast steps)
    is added back.

    Args:
        dim: hidden width.
        horizon: steps to forecast.
        num_patches: patches per channel ``P`` (the flatten head's input is ``P*D``); None: mean-pool the
            patches instead (any input length). A recipe writes ``num_patches: mean`` for that; ``auto`` or
            leaving it out computes ``P`` from the data.
        dropout: dropout before the projection.
        loss_type: ``"mse"`` or ``"l1"``.
    """

    task = "forecasting"

    default_target = "target"

    def __init__(self, dim: int, horizon: int, num_patches: int | None = None, dropout: float = 0.0, loss_type: str = "mse"):
        super().__init__(dim)
        if not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be a positive int; got {horizon!r}")
        if loss_type not in ("mse", "l1"):
            raise ValueError(f"loss_type must be 'mse' or 'l1'; got {loss_type!r}")
        self.horizon, self.num_patches, self.loss_type = horizon, num_patches, loss_type
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(dim * (num_patches or 1), horizon)

    def forward(self, hidden: torch.Tensor, seq: TokenSeq | None = None) -> torch.Tensor:
        self._check_hidden(hidden, seq, self.dim)
        extras = seq.extras if seq is not None else {}
        x = hidden[:, seq.num_prefix_tokens :] if seq is not None else hidden
        if self.num_patches is None:
            x = masked_pool(x, None, "mean")
        else:
            if x.shape[1] != self.num_patches:
                raise ValueError(f"forecasting head was built for num_patches={self.num_patches}; got {x.shape[1]} patch tokens")
            x = x.flatten(1)
        y = self.proj(self.dropout(x))  # [B*C, H]
        c = int(extras.get("channels", 1))
        if y.shape[0] % c:
            raise ValueError(f"forecasting head got {y.shape[0]} sequences, not a multiple of channels={c}")
        y = y.reshape(-1, c, self.horizon).transpose(1, 2)  # [B, H, C]
        revin = extras.get("revin")
        if revin is not None:
            y = revin.denormalize(y)
        season = extras.get("season")
        if season is not None:
            if tuple(season.shape) != tuple(y.shape):
                raise ValueError(f"the tokenizer's season covers {season.shape[1]} forecast steps of {season.shape[2]} channels; this head forecasts {tuple(y.shape[1:])}")
            y = y + season.to(y.dtype)
        return y

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if target is None or tuple(target.shape) != tuple(output.shape):
            raise ValueError(f"forecasting target must be [B, horizon, C] = {tuple(output.shape)}; got {getattr(target, 'shape', target)}")
        return (F.mse_loss if self.loss_type == "mse" else F.l1_loss)(output, target.to(output.dtype))


@register_head("token")
class TokenHead(Head):
    """Per-token prediction (per point group, per patch, per word): LayerNorm + Linear on every token
    after the prefix -> ``[B, N - prefix, C]``. Targets ``[B, N - prefix]`` hold ``ignore_index`` at
    padded tokens (the collate functions pad token labels with it), which the loss skips.

    Args:
        dim: hidden width.
        num_classes: classes per token.
        ignore_index: target value that is skipped by the loss.
    """

    task = "token"

    default_target = "token_labels"

    def __init__(self, dim: int, num_classes: int, ignore_index: int = -100):
        super().__init__(dim)
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.mlp = _mlp(dim, num_classes, None, 0.0, True)

    def forward(self, hidden: torch.Tensor, seq: TokenSeq | None = None) -> torch.Tensor:
        self._check_hidden(hidden, seq, self.dim)
        p = seq.num_prefix_tokens if seq is not None else 0
        logits = self.mlp(hidden[:, p:])
        if seq is not None and seq.mask is not None:
            logits = logits.masked_fill(~seq.mask[:, p:, None], 0.0)  # padded tokens predict nothing
        return logits

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if target is None or tuple(target.shape) != tuple(output.shape[:2]):
            raise ValueError(f"token-level target must be [B, N] = {tuple(output.shape[:2])}; got {getattr(target, 'shape', target)}")
        return F.cross_entropy(output.flatten(0, 1), target.long().flatten(), ignore_index=self.ignore_index)


def info_nce(a: torch.Tensor, b: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE (CLIP's loss) for L2-normalised paired embeddings ``a, b`` ``[B, E]``:
    the mean of cross-entropy over rows and over columns of ``scale * a @ b.T`` with the diagonal as
    the positives."""
    logits = logit_scale * a @ b.t()
    labels = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))


@register_head("contrastive")
class ContrastiveHead(Head):
    """Cross-modal retrieval (CLIP-style): a projection per modality, L2 normalisation, a learnable
    logit scale (stored as its log, clamped to ``max_logit_scale``), symmetric InfoNCE.

    Reads two separately-encoded modalities (``fusion="separate"``). Output: ``{modality: [B, E]``
    embeddings, ``"logit_scale"``: scalar, ``"logits"``: ``[B, B]`` (first modality's rows)}``.

    Args:
        dim: hidden width.
        embed_dim: shared embedding width ``E``.
        modalities: the two modalities it contrasts (defaults to the head's ``inputs``).
        pool: pooling of each modality's sequence.
        init_logit_scale: initial temperature inverse (CLIP: 1/0.07).
        max_logit_scale: clamp of the scale (CLIP: 100).
    """

    task = "contrastive"

    multi_input = True
    default_target = None

    def __init__(
        self,
        dim: int,
        embed_dim: int = 128,
        modalities: list[str] | tuple[str, ...] = ("a", "b"),
        pool: str = "mean",
        init_logit_scale: float = 1 / 0.07,
        max_logit_scale: float = 100.0,
    ):
        super().__init__(dim)
        if len(modalities) != 2 or len(set(modalities)) != 2:
            raise ValueError(f"contrastive head needs two distinct modalities; got {list(modalities)}")
        if pool not in POOLINGS:
            raise ValueError(f"pool must be one of {POOLINGS}; got {pool!r}")
        self.modalities = list(modalities)
        self.inputs = list(modalities)
        self.pool, self.embed_dim = pool, embed_dim
        self.init_logit_scale, self.max_logit_scale = init_logit_scale, max_logit_scale
        self.proj = nn.ModuleDict({m: nn.Linear(dim, embed_dim, bias=False) for m in self.modalities})
        self.log_logit_scale = nn.Parameter(torch.empty(()))
        if self.log_logit_scale.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in self.proj.values():
            p.reset_parameters()
        with torch.no_grad():
            self.log_logit_scale.fill_(math.log(self.init_logit_scale))

    @property
    def logit_scale(self) -> torch.Tensor:
        return self.log_logit_scale.clamp(max=math.log(self.max_logit_scale)).exp()

    def forward(self, features: dict[str, tuple[torch.Tensor, TokenSeq]]) -> dict[str, torch.Tensor]:
        missing = [m for m in self.modalities if m not in features]
        if missing:
            raise ValueError(f"contrastive head needs modalities {self.modalities}; missing {missing}")
        out: dict[str, torch.Tensor] = {}
        for m in self.modalities:
            hidden, seq = features[m]
            self._check_hidden(hidden, seq, self.dim)
            pooled = pool_sequence(hidden, seq, self.pool)
            out[m] = F.normalize(self.proj[m](pooled), dim=-1)
        a, b = (out[m] for m in self.modalities)
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"contrastive pairs need equal batch sizes; got {a.shape[0]} and {b.shape[0]}")
        scale = self.logit_scale
        out["logit_scale"] = scale
        out["logits"] = scale * a @ b.t()
        return out

    def loss(self, output: dict[str, torch.Tensor], target: torch.Tensor | None = None) -> torch.Tensor:
        a, b = (output[m] for m in self.modalities)
        return info_nce(a, b, output["logit_scale"])
