"""mmte.heads: task heads on the backbone's hidden states, creatable by name.

>>> from mmte import heads
>>> head = heads.create("classification", dim=64, num_classes=10, pool="mean")

Third-party heads register with :func:`register_head` or the entry-point group ``mmte.heads``.
"""

from __future__ import annotations

from ..errors import UnknownNameError
from ..registry import Registry
from .base import POOLINGS, Head, masked_pool
from .heads import ClassificationHead, ContrastiveHead, ForecastingHead, RegressionHead, TokenHead, info_nce, pool_sequence

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


class UnknownHeadError(UnknownNameError):
    """An unknown head name (a ``ValueError`` and a ``KeyError``), listing the registered heads and the
    closest one."""

    def __init__(self, name: object, known, fix: str = "set the head's name: to one of them"):
        super().__init__("head", name, known, fix)

    def __reduce__(self):
        return (type(self), (self.name, self.known, self.fix))


def get_head(name: str) -> type[Head]:
    """The head class registered as ``name``.

    Raises:
        UnknownHeadError: naming the registered heads.
    """
    if name not in HEADS:
        raise UnknownHeadError(name, HEADS.list())
    return HEADS.get(name)


def create(name: str, dim: int, **kwargs) -> Head:
    """Build the head registered as ``name`` with width ``dim`` (keyword arguments go to its class).

    Raises:
        UnknownHeadError: (a ``ValueError``) for an unknown name, listing the registered heads.
    """
    return get_head(name)(dim, **kwargs)
