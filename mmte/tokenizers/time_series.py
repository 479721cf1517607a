"""Time-series tokenizer: PatchTST (Nie et al. 2023) patching with channel independence and RevIN.

1. Reversible instance normalisation: each series' channel is standardised by its own mean and std
   over the input window (and optionally scaled by a learned per-channel affine); the statistics
   travel in ``TokenSeq.extras["revin"]`` so a forecasting head maps predictions back.
2. The end is padded by repeating the last value ``stride`` times; windows of ``patch_len`` every
   ``stride`` steps become tokens via a shared Linear, plus a learned position embedding.
3. Channel independence: each of the ``C`` channels is its own sequence, so ``B`` series of ``C``
   channels give ``[B*C, P, D]`` tokens (``extras["channels"] = C``), with
   ``P = (L - patch_len) // stride + 1 (+ 1 with end padding)``.

A known seasonal cycle (``season``: its level over the input and forecast steps, e.g. the daily profile
a :class:`~mmte.training.data.ForecastDataModule` with ``cycle`` computes from the timestamps) is
subtracted from the inputs first, and its forecast-step part travels in ``extras["season"]`` so a
forecasting head adds it back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..data.time_series import collate_series, example_series, preprocess_series
from .base import ModalityTokenizer, TokenSeq
from .registry import register_modality

__all__ = ["RevIN", "RevINStats", "TimeSeriesTokenizer"]


@dataclass
class RevINStats:
    """Per-series statistics of reversible instance normalisation (``[B, 1, C]`` each)."""

    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    eps: float = 1e-5

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        """``[B, H, C]`` in normalised units -> the input's units."""
        if self.weight is not None:
            y = (y - self.bias) / (self.weight + self.eps * self.eps)
        return y * self.std + self.mean


# a pytree node, so the statistics can cross a pipeline-stage boundary (mmte.parallel.boundary) and torch.export
pytree.register_dataclass(RevINStats, serialized_type_name="mmte.tokenizers.time_series.RevINStats")


class RevIN(nn.Module):
    """Reversible instance normalisation with an optional learned per-channel affine."""

    def __init__(self, num_channels: int | None, affine: bool = True, eps: float = 1e-5, *, params_dtype=None, device=None):
        super().__init__()
        self.num_channels, self.eps = num_channels, eps
        kw = {"device": device, "dtype": params_dtype}
        self.affine = bool(affine and num_channels)
        self.weight = nn.Parameter(torch.empty(num_channels, **kw)) if self.affine else None
        self.bias = nn.Parameter(torch.empty(num_channels, **kw)) if self.affine else None
        if self.weight is not None and self.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RevINStats]:
        mean = x.mean(1, keepdim=True).detach()
        std = (x.var(1, keepdim=True, unbiased=False) + self.eps).sqrt().detach()
        y = (x - mean) / std
        if self.weight is not None:
            y = y * self.weight + self.bias
        # the statistics carry copies of the affine (gradients still reach the parameters): a sharded
        # runtime (FSDP2) frees this module's gathered parameters after its forward, before the head uses them
        w, b = (self.weight.clone(), self.bias.clone()) if self.weight is not None else (None, None)
        return y, RevINStats(mean, std, w, b, self.eps)


@register_modality(
    "time_series",
    preprocess=preprocess_series,
    collate=collate_series,
    default_head={"name": "forecasting", "horizon": 24},
    example=example_series,
    example_config={"patch_len": 16, "stride": 8, "num_channels": 3, "max_patches": 16},
    description="series [B, L, C]: PatchTST patches per channel (channel independence) + RevIN -> [B*C, P, D]",
)
class TimeSeriesTokenizer(ModalityTokenizer):
    """Series ``[B, L, C]`` -> ``[B*C, P, D]`` patch tokens (channel independence).

    Args:
        dim: token width.
        patch_len: time steps per patch (16).
        stride: step between patches (8).
        max_patches: longest sequence of patches the position embedding covers.
        num_channels: channels ``C`` (required for the learned RevIN affine; None: any C, no affine).
        revin: apply reversible instance normalisation.
        revin_affine: learn a per-channel affine in RevIN.
        pad_end: repeat the last value ``stride`` times before patching (PatchTST).
    """

    modality = "time_series"

    def __init__(
        self,
        dim: int,
        patch_len: int = 16,
        stride: int = 8,
        max_patches: int = 128,
        num_channels: int | None = None,
        revin: bool = True,
        revin_affine: bool = True,
        pad_end: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        if patch_len < 1 or stride < 1:
            raise ValueError(f"patch_len and stride must be positive; got {patch_len}, {stride}")
        self.patch_len, self.stride, self.max_patches, self.pad_end = patch_len, stride, max_patches, pad_end
        self.num_channels = num_channels
        kw = {"device": device, "dtype": params_dtype}
        self.revin = RevIN(num_channels, revin_affine, params_dtype=params_dtype, device=device) if revin else None
        self.proj = nn.Linear(patch_len, dim, **kw)
        self.pos_embed = nn.Parameter(torch.empty(1, max_patches, dim, **kw))
        self.num_prefix_tokens = 0
        if self.proj.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.revin is not None:
            self.revin.reset_parameters()

    def num_patches(self, length: int) -> int:
        """``(L - patch_len) // stride + 1``, plus one with end padding."""
        return (length - self.patch_len) // self.stride + 1 + int(self.pad_end)

    def num_tokens(self, length: int) -> int:
        """Tokens per channel sequence (the backbone sees ``B*C`` sequences of this length)."""
        return self.num_patches(length)

    def forward(self, series: torch.Tensor, season: torch.Tensor | None = None) -> TokenSeq:
        """Args:
            series: ``[B, L, C]`` finite values.
            season: ``[B, L + H, C]`` a known cycle's level at the ``L`` input and ``H`` forecast steps:
                subtracted from the inputs, and added back to forecasts by the head; None: no cycle.
        """
        if series.dim() != 3:
            raise ValueError(f"time_series tokenizer expects series [B, L, C]; got shape {tuple(series.shape)}")
        b, length, c = series.shape
        if self.num_channels is not None and c != self.num_channels:
            raise ValueError(f"time_series tokenizer expects series [B, L, C={self.num_channels}]; got shape {tuple(series.shape)}")
        if length < self.patch_len:
            raise ValueError(f"series length {length} is shorter than patch_len={self.patch_len}")
        if not bool(torch.isfinite(series).all()):
            raise ValueError("time series holds NaN/inf; expected finite values (impute missing steps first)")
        p = self.num_patches(length)
        if p > self.max_patches:
            raise ValueError(f"series length {length} gives {p} patches; this tokenizer takes at most max_patches={self.max_patches}")
        x = series.to(self.proj.weight.dtype)
        extras: dict = {}
        if season is not None:
            if season.dim() != 3 or season.shape[0] != b or season.shape[2] != c or season.shape[1] <= length:
                raise ValueError(f"season must be [B, L + horizon, C] with B={b}, L={length}, C={c}; got shape {tuple(season.shape)}")
            if not bool(torch.isfinite(season).all()):
                raise ValueError("season holds NaN/inf; expected finite values")
            season = season.to(x.dtype)
            x, extras["season"] = x - season[:, :length], season[:, length:]
        stats = None
        if self.revin is not None:
            x, stats = self.revin(x)
        x = x.transpose(1, 2)  # [B, C, L]
        if self.pad_end:
            x = torch.cat([x, x[..., -1:].expand(-1, -1, self.stride)], -1)
        patches = x.unfold(-1, self.patch_len, self.stride)  # [B, C, P, patch_len]
        tokens = self.proj(patches) + self.pos_embed[:, :p]
        return TokenSeq(tokens.reshape(b * c, p, self.dim), None, 0, extras={"channels": c, "revin": stats, **extras})
