"""The modality registry: one entry per modality, creatable by name.

A modality is registered once, bundling everything needed to use it:

* its tokenizer class (an ``nn.Module`` whose ``forward`` returns a :class:`TokenSeq`),
* its config dataclass (by default derived from the tokenizer's keyword arguments),
* its preprocessing (raw file / array -> one sample) and collate (samples -> batch), from :mod:`mmte.data`,
* its default head (a head-registry name plus keyword arguments),
* an ``example(size, seed)`` that builds one realistic preprocessed sample (used by the registry sweep
  test and by ``mmte modalities``), and whether samples of different lengths can share a batch
  (``variable_length``: collate pads and the tokenizer returns a padding mask).

Register with the decorator::

    @register_modality("wavelet", preprocess=..., collate=..., example=..., default_head={"name": "classification"})
    class WaveletTokenizer(ModalityTokenizer):
        ...

or from another package through the entry-point group ``mmte.modalities`` (the entry point names a
module or object whose import registers the modality; a bare tokenizer class or a
:class:`ModalitySpec` is registered under the entry point's name). :func:`reload` rescans the group.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
import inspect
import logging
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import UnknownNameError, UsageError, closest
from ..registry import Registry

logger = logging.getLogger(__name__)

__all__ = [
    "MODALITIES",
    "ModalitySpec",
    "UnknownModalityError",
    "collate_modalities",
    "create",
    "get_modality",
    "list_modalities",
    "register_modality",
    "reload",
]

# Modules whose import registers the built-in modalities.
_BUILTIN_MODULES = (
    "mmte.tokenizers.text",
    "mmte.tokenizers.image",
    "mmte.tokenizers.infrared",
    "mmte.tokenizers.hyperspectral",
    "mmte.tokenizers.audio",
    "mmte.tokenizers.video",
    "mmte.tokenizers.point_cloud",
    "mmte.tokenizers.tabular",
    "mmte.tokenizers.graph",
    "mmte.tokenizers.time_series",
    "mmte.tokenizers.imu",
)
_NOT_CONFIG = {"self", "dim", "params_dtype", "device"}


class UnknownModalityError(UnknownNameError):
    """An unknown modality name (a ``ValueError`` and, for dict-like callers, a ``KeyError``), listing the
    registered modalities and the closest one."""

    def __init__(self, name: object, known, fix: str = "see mmte list modalities (to add one: docs/extending.md)"):
        super().__init__("modality", name, known, fix)

    def __reduce__(self):
        return (type(self), (self.name, self.known, self.fix))


def config_from_signature(cls: type) -> type:
    """A dataclass whose fields are ``cls.__init__``'s keyword arguments except ``dim``/dtype/device."""
    fields_ = []
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name in _NOT_CONFIG or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = Any
        if p.default is inspect.Parameter.empty:
            fields_.append((p.name, ann))
        elif isinstance(p.default, (list, dict, set)):
            fields_.append((p.name, ann, field(default_factory=lambda d=p.default: type(d)(d))))
        else:
            fields_.append((p.name, ann, field(default=p.default)))
    required = [f for f in fields_ if len(f) == 2]
    optional = [f for f in fields_ if len(f) == 3]
    return dataclasses.make_dataclass(f"{cls.__name__}Config", required + optional, frozen=True)


@dataclass
class ModalitySpec:
    """Everything mmte needs to know about one modality.

    Attributes:
        name: registry name (also the default batch key).
        tokenizer: the tokenizer class; built as ``tokenizer(dim=..., **config_fields)``.
        config: a dataclass type holding the tokenizer's configuration.
        preprocess: raw input (file path / array) -> one sample, or None.
        collate: list of samples -> batch value (tensor or dict of tensors), or None (``torch.stack``).
        default_head: ``{"name": head registry name, **head kwargs}``.
        example: ``example(size: int, seed: int) -> sample``; ``size`` 0 is small, 1 is larger.
        example_config: tokenizer config used with ``example`` (small sizes for tests).
        variable_length: samples of different sizes can be collated together (padding + mask).
        description: one line for ``mmte modalities``.
    """

    name: str
    tokenizer: type[nn.Module]
    config: type | None = None
    preprocess: Callable[..., Any] | None = None
    collate: Callable[[list[Any]], Any] | None = None
    default_head: dict[str, Any] = field(default_factory=lambda: {"name": "classification"})
    example: Callable[[int, int], Any] | None = None
    example_config: dict[str, Any] = field(default_factory=dict)
    variable_length: bool = False
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"modality name must be a non-empty string; got {self.name!r}")
        if not (isinstance(self.tokenizer, type) and issubclass(self.tokenizer, nn.Module)):
            raise TypeError(f"modality {self.name!r}: tokenizer must be an nn.Module subclass; got {self.tokenizer!r}")
        if self.config is None:
            self.config = config_from_signature(self.tokenizer)
        elif not dataclasses.is_dataclass(self.config):
            raise TypeError(f"modality {self.name!r}: config must be a dataclass type; got {self.config!r}")
        if "name" not in self.default_head:
            raise ValueError(f"modality {self.name!r}: default_head needs a 'name'; got {self.default_head!r}")

    def make_config(self, **config: Any):
        """Validate keyword arguments against the config dataclass (names, and types where the tokenizer's
        ``__init__`` annotates them: ``patch_size: "4"`` is refused, naming the option)."""
        names = [f.name for f in dataclasses.fields(self.config)]
        unknown = sorted(set(config) - set(names))
        if unknown:
            hit = closest(unknown[0], names)
            raise UsageError(f"unknown {self.name} tokenizer option(s) {unknown}", f"expected some of {names}"
                             + (f" (did you mean {hit[0]!r}?)" if hit else ""), "fix or drop them")
        hints = _init_hints(self.tokenizer)
        for k, v in config.items():
            hint = hints.get(k)
            if hint is not None and not _type_ok(v, hint):
                fix = f"write {k}: {v}" if isinstance(v, str) and v.strip().lstrip("-").replace(".", "", 1).isdigit() else "see the tokenizer's docstring"
                raise UsageError(f"{self.name} tokenizer option {k} is {v!r} (a {type(v).__name__})", f"expected {_hint_text(hint)}",
                                 fix + (" (no quotes: a quoted number is a string)" if isinstance(v, str) else ""))
        try:
            return self.config(**config)
        except TypeError as e:
            raise UsageError(f"invalid {self.name} tokenizer config {config} ({e})", f"expected the options {names}", "fix the recipe") from None

    def create(self, *args: Any, **config: Any) -> nn.Module:
        """Build the tokenizer: ``create(dim, **config)`` or ``create(dim=..., **config)`` ->
        ``tokenizer(dim=dim, **config)`` after validation. A ``dim`` among the options of a tokenizer whose width
        is given positionally (the model passes the backbone's hidden size) is refused, naming both."""
        if len(args) > 1:
            raise TypeError(f"create() takes the width dim and keyword options; got {len(args)} positional arguments")
        if not args:
            if "dim" not in config:
                raise TypeError("create() needs the token width dim")
            args = (config.pop("dim"),)
        dim = args[0]
        if "dim" in config:
            raise UsageError(f"{self.name} tokenizer option dim is {config['dim']!r}, but a tokenizer's width is the backbone's hidden size ({dim})",
                             "expected no dim among the tokenizer's options", "remove dim (the backbone preset sets the width)")
        extra = {k: config.pop(k) for k in ("params_dtype", "device") if k in config}
        cfg = self.make_config(**config)
        kwargs = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        return self.tokenizer(dim=dim, **kwargs, **extra)

    def collate_fn(self, samples: list[Any]) -> Any:
        if self.collate is not None:
            return self.collate(samples)
        import torch

        return torch.stack(list(samples))


def _init_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 - unresolvable annotations: no type checks
        return {}


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether a YAML/CLI value fits a simple annotation (int, float, bool, str, None, unions, tuples, lists,
    Literal, dicts); anything else is accepted."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is typing.Literal:
        return value in args
    if origin in (tuple, list, collections.abc.Sequence):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_type_ok(v, a) for v, a in zip(value, args))
        return not args or all(_type_ok(v, args[0]) for v in value)
    if origin in (dict, collections.abc.Mapping) or hint in (dict, collections.abc.Mapping):
        return isinstance(value, collections.abc.Mapping)
    return True


def _hint_text(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_hint_text(a) for a in args)
    if hint is type(None):
        return "null"
    if origin is tuple:
        return "a list [" + ", ".join("..." if a is Ellipsis else _hint_text(a) for a in args) + "]"
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    names = {int: "an int", float: "a number", bool: "true/false", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


class _ModalityRegistry(Registry[ModalitySpec]):
    """Registry of :class:`ModalitySpec` that imports the built-ins before the first registration or read,
    and plug-ins on the first read."""

    _builtins_loaded = False

    def _before_register(self, obj: Any) -> None:
        if getattr(getattr(obj, "tokenizer", None), "__module__", None) in _BUILTIN_MODULES:
            return  # a built-in module's own decorator, while that module is being imported
        self._load_builtins()  # a user registration can never come first and hide a built-in

    def _load_builtins(self) -> None:
        if _ModalityRegistry._builtins_loaded:
            return
        _ModalityRegistry._builtins_loaded = True
        for mod in _BUILTIN_MODULES:
            importlib.import_module(mod)

    def _load_entry_points(self) -> None:
        self._load_builtins()
        super()._load_entry_points()

    def _from_entry_point(self, name: str, obj: Any) -> ModalitySpec | None:
        if isinstance(obj, ModalitySpec):  # registered under its own name
            if obj.name not in self._items:
                self.register(obj.name, obj)
            return None
        if isinstance(obj, type) and issubclass(obj, nn.Module):
            return None if any(s.tokenizer is obj for s in self._items.values()) else ModalitySpec(name, obj, description=_first_line(obj))
        return None

    def get(self, name: str) -> ModalitySpec:
        self._load_entry_points()
        key = self.resolve_path(name)
        if key is None:
            raise UnknownModalityError(name, self._items)
        return self._items[key]


MODALITIES = _ModalityRegistry("modality", "mmte.modalities")


def register_modality(
    name: str | None = None,
    *,
    tokenizer: type[nn.Module] | None = None,
    config: type | None = None,
    preprocess: Callable[..., Any] | None = None,
    collate: Callable[[list[Any]], Any] | None = None,
    default_head: dict[str, Any] | None = None,
    example: Callable[[int, int], Any] | None = None,
    example_config: dict[str, Any] | None = None,
    variable_length: bool = False,
    description: str = "",
    override: bool = False,
):
    """Register a modality; a class decorator, or a direct call when ``tokenizer`` is given.

    Args:
        name: registry name (default: the class's ``modality`` attribute).
        tokenizer: the tokenizer class (direct form).
        config, preprocess, collate, default_head, example, example_config, variable_length,
            description: see :class:`ModalitySpec`.
        override: replace an existing registration of the same name.

    Returns:
        the class (decorator form) or the :class:`ModalitySpec` (direct form).
    """

    def add(cls: type[nn.Module]) -> ModalitySpec:
        key = name or getattr(cls, "modality", "") or cls.__name__
        spec = ModalitySpec(
            key,
            cls,
            config,
            preprocess,
            collate,
            dict(default_head) if default_head else {"name": "classification"},
            example,
            dict(example_config or {}),
            variable_length,
            description or _first_line(cls),
        )
        old = MODALITIES._items.get(key)
        same = old is not None and (old.tokenizer.__module__, old.tokenizer.__qualname__) == (cls.__module__, cls.__qualname__)
        MODALITIES.register(key, spec, override=override or same)
        return spec

    if tokenizer is not None:
        return add(tokenizer)

    def deco(cls: type[nn.Module]) -> type[nn.Module]:
        add(cls)
        return cls

    return deco


def _first_line(obj: Any) -> str:
    return (inspect.getdoc(obj) or "").split("\n")[0]


def list_modalities(pattern: str = "*") -> list[str]:
    """Names of the registered modalities (built-ins and plug-ins), sorted; ``pattern`` is a glob."""
    return MODALITIES.list(pattern)


def get_modality(name: str) -> ModalitySpec:
    """The :class:`ModalitySpec` registered as ``name``.

    Raises:
        UnknownModalityError: (a ``ValueError``) naming the registered modalities.
    """
    return MODALITIES.get(name)


def create(name: str, *args: Any, **config: Any) -> nn.Module:
    """Build the tokenizer of modality ``name`` with token width ``dim`` and its config options.

    ``params_dtype`` and ``device`` are passed through when given.
    """
    return get_modality(name).create(*args, **config)


def collate_modalities(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`mmte.data.collate_batch` with each registered modality's own collate for its batch key.

    ``samples`` are ``{modality: sample, target_key: value}`` dicts; keys that are not registered
    modality names are stacked.
    """
    from ..data import collate_batch

    keys = samples[0] if samples else {}
    return collate_batch(samples, {k: MODALITIES.get(k).collate_fn for k in keys if k in MODALITIES})


def reload() -> list[str]:
    """Rescan the ``mmte.modalities`` entry-point group (after installing a plug-in in this process)."""
    MODALITIES.reload_entry_points()
    return list_modalities()
