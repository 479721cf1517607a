"""Image preprocessing: arrays / PIL images / files -> normalised float tensors ``[C, H, W]``."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .collate import stack_same

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "collate_images", "example_image", "preprocess_image"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _to_tensor(image) -> torch.Tensor:
    if isinstance(image, (str, os.PathLike)):
        from PIL import Image

        with Image.open(image) as im:
            image = np.asarray(im)
    if hasattr(image, "mode") and hasattr(image, "size"):  # PIL image
        image = np.asarray(image)
    if isinstance(image, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(image))
        if t.dim() == 3 and t.shape[-1] in (1, 3, 4) and t.shape[0] not in (1, 3, 4):
            t = t.permute(2, 0, 1)  # HWC -> CHW
    elif isinstance(image, torch.Tensor):
        t = image
    else:
        raise TypeError(f"image must be a path, PIL image, numpy array or tensor; got {type(image).__name__}")
    if t.dim() == 2:
        t = t[None]
    if t.dim() != 3:
        raise ValueError(f"image must be [H, W], [H, W, C] or [C, H, W]; got shape {tuple(t.shape)}")
    if t.dtype == torch.uint8:
        t = t.float() / 255.0
    return t.float()


def preprocess_image(
    image,
    size: int | tuple[int, int] | None = 224,
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
    channels: int | None = 3,
) -> torch.Tensor:
    """Decode, convert channels, resize (bilinear, antialiased) and normalise one image.

    Args:
        image: file path, PIL image, ``[H, W]``/``[H, W, C]`` uint8/float array, or ``[C, H, W]`` tensor
            (uint8 is scaled to [0, 1]).
        size: output ``(H, W)`` (int: square); None keeps the size.
        mean, std: per-channel normalisation (None: none).
        channels: 3 (grey is repeated, alpha dropped) or 1 (RGB is converted to luminance); None keeps.

    Returns:
        float ``[channels, H, W]``.
    """
    t = _to_tensor(image)
    if channels is not None:
        if t.shape[0] == 4:
            t = t[:3]
        if channels == 3 and t.shape[0] == 1:
            t = t.expand(3, -1, -1)
        elif channels == 1 and t.shape[0] == 3:
            t = (t * torch.tensor([0.299, 0.587, 0.114])[:, None, None]).sum(0, keepdim=True)
        if t.shape[0] != channels:
            raise ValueError(f"cannot convert an image with {t.shape[0]} channels to {channels} channels")
    if size is not None:
        hw = (size, size) if isinstance(size, int) else tuple(size)
        if tuple(t.shape[-2:]) != hw:
            t = F.interpolate(t[None], size=hw, mode="bilinear", antialias=True, align_corners=False)[0]
    if mean is not None and std is not None:
        if len(mean) != t.shape[0] or len(std) != t.shape[0]:
            raise ValueError(f"mean/std need {t.shape[0]} values (one per channel); got {len(mean)} and {len(std)}")
        t = (t - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    return t.contiguous()


def collate_images(samples: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack same-sized ``[C, H, W]`` images into ``[B, C, H, W]``."""
    return stack_same(samples, "image")


@functools.lru_cache(maxsize=1)
def _sample_images() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_sample_images

    return tuple(load_sample_images().images)


def example_image(size: int, seed: int, channels: int = 3, sizes: tuple[int, int] = (32, 48)) -> torch.Tensor:
    """A real photograph (scikit-learn's bundled sample images), cropped at a seed-dependent place and
    resized to ``sizes[size]``."""
    imgs = _sample_images()
    img = imgs[seed % len(imgs)]
    g = np.random.default_rng(seed)
    h, w = img.shape[:2]
    c = int(g.integers(128, min(h, w)))
    y, x = int(g.integers(0, h - c)), int(g.integers(0, w - c))
    return preprocess_image(img[y : y + c, x : x + c], sizes[size], None if channels == 1 else IMAGENET_MEAN, None if channels == 1 else IMAGENET_STD, channels)
