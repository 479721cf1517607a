"""The head registry: head classes by name (``classification``, ``regression``, ...).

Register a :class:`~mmte.heads.base.Head` subclass with the decorator::

    @register_head("rhythm")
    class RhythmHead(ClassificationHead):
        ...

or from another package through the entry-point group ``mmte.heads``. The built-in heads register
themselves when :mod:`mmte.heads` is imported, before any other registration can happen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UnknownNameError
from ..registry import Registry
from .base import Head

__all__ = ["HEADS", "UnknownHeadError", "create", "get_head", "list_heads", "register_head"]

class _HeadRegistry(Registry[type[Head]]):
    """Head classes; a plug-in entry point or a class path must name a :class:`Head` subclass."""

    def _from_entry_point(self, name: str, obj: Any) -> type[Head] | None:
        return super()._from_entry_point(name, obj) if isinstance(obj, type) and issubclass(obj, Head) else None


HEADS = _HeadRegistry("head", "mmte.heads")


def register_head(name: str | None = None, *, override: bool = False) -> Callable[[type], type]:
    """Class decorator registering a :class:`Head` subclass under ``name`` (default: the class name)."""
    return HEADS.register(name, override=override)


def list_heads(pattern: str = "*") -> list[str]:
    """Names of the registered heads (built-ins and plug-ins), sorted; ``pattern`` is a glob."""
    return HEADS.list(pattern)


class UnknownHeadError(UnknownNameError):
    """An unknown head name (a ``ValueError`` and a ``KeyError``), listing the registered heads and the
    closest one."""

    def __init__(self, name: object, known, fix: str = "set the head's name: to one of them (new heads: see docs/extending.md)"):
        super().__init__("head", name, known, fix)

    def __reduce__(self):
        return (type(self), (self.name, self.known, self.fix))


def get_head(name: str) -> type[Head]:
    """The head class registered as ``name``.

    Raises:
        UnknownHeadError: naming the registered heads.
    """
    if name not in HEADS and HEADS.resolve_path(name) is None:
        raise UnknownHeadError(name, HEADS.list())
    return HEADS.get(name)


def create(name: str, dim: int, **kwargs) -> Head:
    """Build the head registered as ``name`` with width ``dim`` (keyword arguments go to its class).

    Raises:
        UnknownHeadError: (a ``ValueError``) for an unknown name, listing the registered heads.
    """
    return get_head(name)(dim, **kwargs)
