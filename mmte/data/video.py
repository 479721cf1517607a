"""Video preprocessing: frames -> uniformly sampled, resized, normalised clip ``[C, T, H, W]``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .collate import pad_stack
from .image import IMAGENET_MEAN, IMAGENET_STD, example_image

__all__ = ["collate_video", "example_video", "preprocess_video", "sample_frame_indices"]


def sample_frame_indices(num_available: int, num_frames: int) -> torch.Tensor:
    """``num_frames`` indices spread uniformly over ``num_available`` frames (segment centres)."""
    if num_available < 1:
        raise ValueError(f"a video needs at least one frame; got {num_available}")
    pos = (torch.arange(num_frames, dtype=torch.float64) + 0.5) * num_available / num_frames
    return pos.floor().long().clamp_(0, num_available - 1)


def preprocess_video(
    frames,
    num_frames: int | None = None,
    size: int | tuple[int, int] | None = 224,
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
) -> torch.Tensor:
    """Frames ``[T, H, W, C]`` (uint8 or float array/tensor) -> ``[C, T', H', W']`` float.

    Args:
        frames: the decoded video.
        num_frames: sample this many frames uniformly (None: keep all).
        size: resize every frame (bilinear, antialiased); None keeps the size.
        mean, std: per-channel normalisation (None: none).
    """
    t = torch.as_tensor(np.asarray(frames)) if not isinstance(frames, torch.Tensor) else frames
    if t.dim() != 4 or t.shape[-1] not in (1, 3):
        raise ValueError(f"video frames must be [T, H, W, C] with C in (1, 3); got shape {tuple(t.shape)}")
    if t.dtype == torch.uint8:
        t = t.float() / 255.0
    t = t.float()
    if num_frames is not None:
        t = t[sample_frame_indices(t.shape[0], num_frames)]
    t = t.permute(0, 3, 1, 2)  # [T, C, H, W]
    if size is not None:
        hw = (size, size) if isinstance(size, int) else tuple(size)
        if tuple(t.shape[-2:]) != hw:
            t = F.interpolate(t, size=hw, mode="bilinear", antialias=True, align_corners=False)
    if mean is not None and std is not None:
        t = (t - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    return t.permute(1, 0, 2, 3).contiguous()


def collate_video(samples: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pad clips ``[C, T_i, H, W]`` along time -> ``{"video": [B, C, T, H, W], "frames": [B]}``."""
    for i, s in enumerate(samples):
        if not isinstance(s, torch.Tensor) or s.dim() != 4:
            raise ValueError(f"video sample {i} must be [C, T, H, W]; got {getattr(s, 'shape', type(s))}")
    video, frames = pad_stack(samples, 1, 0.0)
    return {"video": video, "frames": frames}


def example_video(size: int, seed: int, frames: tuple[int, int] = (4, 8), px: int = 32) -> torch.Tensor:
    """A camera pan over a real photograph: ``frames[size]`` frames of ``px x px``, ``[3, T, px, px]``."""
    img = example_image(1, seed, sizes=(px, 2 * px))  # [3, 2px, 2px]
    n = frames[size]
    shifts = torch.linspace(0, px, n).round().long().tolist()
    return torch.stack([img[:, s // 2 : s // 2 + px, s : s + px] for s in shifts], 1).contiguous()
