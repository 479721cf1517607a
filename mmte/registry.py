"""A small generic registry: name -> object, with glob listing and entry-point discovery."""

from __future__ import annotations

import fnmatch
import importlib
import logging
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from .errors import UnknownNameError, UsageError, known_and_closest

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["Registry", "entry_from_class_path", "import_object"]


def import_object(path: str) -> Any:
    """The object a dotted path names: ``package.module.Name`` or ``package.module:Name``.

    Returns None when ``path`` is not a dotted path or its module does not exist (so the caller can report
    an unknown name); an error raised while importing an existing module propagates.
    """
    if not isinstance(path, str) or ("." not in path and ":" not in path) or path.startswith(".") or " " in path:
        return None
    mod, _, attr = path.replace(":", ".").rpartition(".")
    try:
        module = importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name and (mod == e.name or mod.startswith(e.name + ".")):
            return None  # that module is not on the path (PYTHONPATH)
        raise
    if not hasattr(module, attr):
        known = [n for n, v in vars(module).items() if isinstance(v, type) and getattr(v, "__module__", None) == module.__name__]
        raise UsageError(f"{path}: module {mod} has no {attr!r}", known_and_closest(attr, known), f"fix the class path (defined in {module.__file__})")
    return getattr(module, attr)


def entry_from_class_path(entry: Any) -> Any:
    """A recipe entry ``{class_path: pkg.mod.Class, init_args: {...}, **rest}`` -> ``{name: pkg.mod.Class,
    **init_args, **rest}`` (the registries resolve a dotted name by importing it); other values unchanged."""
    if not isinstance(entry, Mapping) or "class_path" not in entry:
        return entry
    out = {k: v for k, v in entry.items() if k not in ("class_path", "init_args")}
    if "name" in out:
        raise UsageError(f"a recipe entry has both name {out['name']!r} and class_path {entry['class_path']!r}",
                         "expected one of them", "drop name (class_path names the class)")
    init = entry.get("init_args") or {}
    if not isinstance(init, Mapping):
        raise UsageError(f"init_args of {entry['class_path']} is {init!r}", "expected a mapping of constructor options", "write init_args: {option: value}")
    return {"name": entry["class_path"], **init, **out}


class Registry(Generic[T]):
    """Maps names to objects (classes, factories, specs).

    Args:
        kind: what is registered, used in error messages ("modality", "head", ...).
        entry_point_group: an ``importlib.metadata`` entry-point group whose entries are loaded
            (once, lazily) the first time the registry is read. Loading an entry point is expected to
            register itself (e.g. a decorated class); if it returns an object that is not yet
            registered, it is registered under the entry point's name.

    Names are unique: registering a taken name (without ``override=True``), or a plug-in entry point named
    like an existing entry, is a :class:`~mmte.errors.UsageError` naming both sources (module and class,
    or entry point and distribution). Built-ins are registered before anything else can be.
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
            self._before_register(o)
            if key in self._items and self._items[key] is not o and not override:
                raise UsageError(
                    f"{self.kind} {key!r} is already registered by {self._source(self._items[key])}; {self._source(o)} registers it again",
                    f"expected a {self.kind} name not taken yet",
                    "register it under another name (or pass override=True to replace the first)",
                )
            self._items[key] = o
            return o

        return add(obj) if obj is not None else add

    def _before_register(self, obj: Any) -> None:
        """Hook run before registering ``obj`` (the modality registry imports its built-ins here)."""

    def _source(self, obj: Any) -> str:
        """Where ``obj`` comes from, for messages: ``module.QualName``."""
        o = getattr(obj, "tokenizer", obj)  # a spec names its class
        mod, qual = getattr(o, "__module__", None), getattr(o, "__qualname__", None)
        return f"{mod}.{qual}" if mod and qual else repr(obj)

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            old = self._items.get(ep.name)
            if old is not None and not self._from_module(old, ep.module):
                dist = f" of distribution {ep.dist.name} {ep.dist.version}" if getattr(ep, "dist", None) is not None else ""
                raise UsageError(
                    f"{self.kind} plug-in {ep.name!r} (entry point {ep.name} = {ep.value}{dist}) clashes with the {self.kind} "
                    f"{ep.name!r} registered by {self._source(old)}",
                    f"expected plug-ins to use new {self.kind} names",
                    f"rename the entry point in the plug-in's metadata, or uninstall it{' (' + ep.dist.name + ')' if dist else ''}",
                )
            try:
                obj = ep.load()
            except Exception as e:  # noqa: BLE001 - a broken plug-in must not break the library
                logger.warning("could not load %s entry point %r (%s): %s", self.kind, ep.name, ep.value, e)
                continue
            if ep.name in self._items:
                continue
            item = self._from_entry_point(ep.name, obj)
            if item is not None:
                self.register(ep.name, item)
            logger.info("loaded %s plug-in %r from %s", self.kind, ep.name, ep.value)

    def _from_module(self, obj: Any, module: str) -> bool:
        """Whether ``obj`` was defined in ``module`` (an entry point re-scanned after it registered itself)."""
        o = getattr(obj, "tokenizer", obj)
        return getattr(o, "__module__", None) == module

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
        key = self.resolve_path(name)
        if key is None:
            raise UnknownNameError(self.kind, name, self._items)
        return self._items[key]

    def resolve_path(self, path: str) -> str | None:
        """The registered name of the object a dotted path (``package.module.Class``) names, importing its
        module; an object registered by that import (a decorated class) keeps its own name, another one is
        registered under ``path``. None when ``path`` names nothing importable."""
        if path in self._items:
            return path
        obj = import_object(path)
        if obj is None:
            return None
        for key, item in self._items.items():
            if item is obj or getattr(item, "tokenizer", None) is obj:
                return key
        item = self._from_entry_point(path, obj)
        if item is None:
            return None
        self.register(path, item)
        logger.info("registered %s %s from its class path", self.kind, path)
        return path

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
