"""mmte.heads: task heads on the backbone's hidden states, creatable by name.

>>> from mmte import heads
>>> head = heads.create("classification", dim=64, num_classes=10, pool="mean")

Third-party heads register with :func:`register_head` or the entry-point group ``mmte.heads``.
"""

from __future__ import annotations

from .base import POOLINGS, Head, masked_pool
from .heads import ClassificationHead, ContrastiveHead, ForecastingHead, RegressionHead, TokenHead, info_nce, pool_sequence
from .registry import HEADS, UnknownHeadError, create, get_head, list_heads, register_head

__all__ = [
    "HEADS",
    "POOLINGS",
    "ClassificationHead",
    "ContrastiveHead",
    "ForecastingHead",
    "Head",
    "RegressionHead",
    "TokenHead",
    "UnknownHeadError",
    "create",
    "get_head",
    "info_nce",
    "list_heads",
    "masked_pool",
    "pool_sequence",
    "register_head",
]
