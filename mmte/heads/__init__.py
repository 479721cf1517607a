"""mmte.heads: task heads on the backbone's hidden states, creatable by name.

>>> from mmte import heads
>>> head = heads.create("classification", dim=64, num_classes=10, pool="mean")

Third-party heads register with :func:`register_head` or the entry-point group ``mmte.heads``.
"""

from __future__ import annotations

from ..registry import Registry
from .base import POOLINGS, Head, masked_pool
from .heads import ClassificationHead, ContrastiveHead, ForecastingHead, RegressionHead, TokenHead, info_nce

__all__ = [
    "HEADS",
    "POOLINGS",
    "ClassificationHead",
    "ContrastiveHead",
    "ForecastingHead",
    "Head",
    "RegressionHead",
    "TokenHead",
    "create",
    "info_nce",
    "list_heads",
    "masked_pool",
    "register_head",
]

HEADS: Registry[type[Head]] = Registry("head", "mmte.heads")
HEADS.register("classification", ClassificationHead)
HEADS.register("regression", RegressionHead)
HEADS.register("forecasting", ForecastingHead)
HEADS.register("token", TokenHead)
HEADS.register("contrastive", ContrastiveHead)


def register_head(name: str):
    """Decorator registering a :class:`Head` subclass under ``name``."""
    return HEADS.register(name)


def list_heads(pattern: str = "*") -> list[str]:
    return HEADS.list(pattern)


def create(name: str, dim: int, **kwargs) -> Head:
    """Build the head registered as ``name`` with width ``dim``.

    Raises:
        KeyError: for an unknown name, listing the registered heads.
    """
    return HEADS.create(name, dim, **kwargs)
