"""IMU tokenizer: a windowed 1-D convolution over time across the sensor axes (accelerometer,
gyroscope, ...). Window ``j`` covers samples ``[j * stride, j * stride + window)`` of all axes and is
real when it lies inside the recording; a learned position embedding over the window index is sliced
to the input's length, and a cls token is prepended."""

from __future__ import annotations

import torch
from torch import nn

from ..data.imu import collate_imu, example_imu, preprocess_imu
from .base import ModalityTokenizer, TokenSeq, prepend_cls
from .registry import register_modality

__all__ = ["IMUTokenizer"]


@register_modality(
    "imu",
    preprocess=preprocess_imu,
    collate=collate_imu,
    default_head={"name": "classification", "pool": "mean"},
    example=example_imu,
    example_config={"in_chans": 6, "window": 10, "stride": 10, "max_windows": 32},
    variable_length=True,
    description="IMU {imu [B, T, C], lengths [B]}: windowed Conv1d over the sensor axes",
)
class IMUTokenizer(ModalityTokenizer):
    """Recordings ``[B, T, C]`` -> ``[cls] + ((T - window) // stride + 1)`` window tokens.

    Args:
        dim: token width.
        in_chans: sensor axes ``C`` (6 = 3-axis accelerometer + gyroscope).
        window: samples per window (kernel size).
        stride: samples between windows.
        max_windows: longest recording in windows that the position embedding covers.
        cls_token: prepend a learned cls token.
    """

    modality = "imu"

    def __init__(
        self,
        dim: int,
        in_chans: int = 6,
        window: int = 10,
        stride: int = 10,
        max_windows: int = 256,
        cls_token: bool = True,
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        self.in_chans, self.window, self.stride, self.max_windows = in_chans, window, stride, max_windows
        kw = {"device": device, "dtype": params_dtype}
        self.proj = nn.Conv1d(in_chans, dim, window, stride, **kw)
        self.norm = nn.LayerNorm(dim, **kw)
        self.pos_embed = nn.Parameter(torch.empty(1, max_windows, dim, **kw))
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.num_prefix_tokens = int(cls_token)
        if self.proj.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()
        self.norm.reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def num_tokens(self, length: int) -> int:
        return self.num_prefix_tokens + (length - self.window) // self.stride + 1

    def forward(self, imu: torch.Tensor, lengths: torch.Tensor | None = None) -> TokenSeq:
        """Args:
            imu: ``[B, T, in_chans]`` (padded along T).
            lengths: real samples per recording ``[B]`` (None: all).
        """
        if imu.dim() != 3 or imu.shape[-1] != self.in_chans:
            raise ValueError(f"imu tokenizer expects recordings [B, T, {self.in_chans}]; got shape {tuple(imu.shape)}")
        b, t, _ = imu.shape
        if t < self.window:
            raise ValueError(f"imu recording has {t} samples; at least window={self.window} expected")
        x = self.proj(imu.transpose(1, 2).to(self.proj.weight.dtype)).transpose(1, 2)  # [B, W, D]
        w = x.shape[1]
        if w > self.max_windows:
            raise ValueError(f"imu recording gives {w} windows; this tokenizer takes at most max_windows={self.max_windows}")
        x = self.norm(x) + self.pos_embed[:, :w]
        mask = None
        if lengths is not None:
            if tuple(lengths.shape) != (b,):
                raise ValueError(f"lengths must be [B={b}]; got shape {tuple(lengths.shape)}")
            if bool((lengths < self.window).any()):
                raise ValueError(f"every recording needs >= window={self.window} samples; got lengths {lengths.tolist()}")
            mask = torch.arange(w, device=x.device)[None] * self.stride + self.window <= lengths[:, None].to(x.device)
        x, mask = prepend_cls(self.cls_token, x, mask)
        return TokenSeq(x, mask, self.num_prefix_tokens)
