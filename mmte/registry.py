"""A small generic registry: name -> object, with glob listing and entry-point discovery."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Maps names to objects (classes, factories, specs).

    Args:
        kind: what is registered, used in error messages ("modality", "head", ...).
        entry_point_group: an ``importlib.metadata`` entry-point group whose entries are loaded
            (once, lazily) the first time the registry is read. Loading an entry point is expected to
            register itself (e.g. a decorated class); if it returns an object that is not yet
            registered, it is registered under the entry point's name.
    """

    def __init__(self, kind: str, entry_point_group: str | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._items: dict[str, T] = {}
        self._entry_points_loaded = entry_point_group is None

    def register(self, name: str | None = None, obj: T | None = None, *, override: bool = False):
        """Register ``obj`` under ``name``; usable as ``@registry.register("name")`` or directly."""

        def add(o: T) -> T:
            key = name or getattr(o, "name", None) or getattr(o, "__name__", None)
            if not isinstance(key, str) or not key:
                raise ValueError(f"cannot register {o!r} as a {self.kind}: no name given")
            if key in self._items and self._items[key] is not o and not override:
                raise ValueError(f"{self.kind} {key!r} is already registered ({self._items[key]!r})")
            self._items[key] = o
            return o

        return add(obj) if obj is not None else add

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            try:
                obj = ep.load()
            except Exception as e:  # a broken plug-in must not break the library
                logger.warning("could not load %s entry point %r (%s): %s", self.kind, ep.name, ep.value, e)
                continue
            if ep.name in self._items:
                continue
            item = self._from_entry_point(ep.name, obj)
            if item is not None:
                self.register(ep.name, item)
            logger.info("loaded %s plug-in %r from %s", self.kind, ep.name, ep.value)

    def _from_entry_point(self, name: str, obj: Any) -> T | None:
        """What to register for a loaded entry point (None: nothing, e.g. it registered itself on import).

        Subclasses adapt plug-in objects here (a bare class into a spec, say)."""
        return None if obj in self._items.values() else obj

    def reload_entry_points(self) -> None:
        """Scan the entry-point group again (after installing a plug-in in the same process)."""
        self._entry_points_loaded = self.entry_point_group is None
        self._load_entry_points()

    def get(self, name: str) -> T:
        self._load_entry_points()
        if name not in self._items:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {known}")
        return self._items[name]

    def create(self, name: str, *args: Any, **kwargs: Any) -> Any:
        factory = self.get(name)
        if not callable(factory):
            raise TypeError(f"{self.kind} {name!r} is not callable")
        return factory(*args, **kwargs)  # type: ignore[operator]

    def list(self, pattern: str = "*") -> list[str]:
        self._load_entry_points()
        return sorted(n for n in self._items if fnmatch.fnmatch(n, pattern))

    def items(self) -> list[tuple[str, T]]:
        self._load_entry_points()
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        self._load_entry_points()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())

    def __len__(self) -> int:
        self._load_entry_points()
        return len(self._items)

    def decorator(self, name: str | None = None) -> Callable[[T], T]:
        return self.register(name)
