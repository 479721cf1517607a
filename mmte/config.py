"""Typed configs for the parts of a model a recipe describes: LoRA, optimisation, tokenizer and head entries.

A recipe's ``model:`` section is plain data (so YAML holds it and a checkpoint stores it); the classes
here give that data a type, so a misspelt option or a value of the wrong type is refused in one line
naming the option and what was expected, before anything is built:

* :class:`LoRAConfig` — the LoRA adapters (``model.lora``), a dataclass the ``mmte`` parser reads
  (``--model.lora.rank 4``).
* :class:`OptimConfig` — AdamW and its schedule (``lr``, ``weight_decay``, ``betas``, ``warmup``,
  ``min_lr_ratio``, ``layer_decay``) and the training-time extras (``mixup``, ``ema_decay``).
* :func:`head_config` / :func:`tokenizer_config` — the config dataclass of a registered head or
  modality, derived from the class's keyword arguments at the time it is asked for, so a head or
  modality registered later (from Python, a class path or an entry point) gets one too.
  :func:`check_head_entry` / :func:`check_tokenizer_entry` validate a recipe entry against it.
* :data:`HeadEntry` / :data:`TokenizerEntry` — one dataclass per section whose fields are the entry keys
  plus every option of every registered head (resp. tokenizer), each ``| None`` (None: not set). They
  type ``MMTEModule``'s ``heads`` and ``tokenizers``, so the ``mmte`` parser merges
  ``--model.heads.digit.dropout 0.1`` into the recipe's entry and refuses an option no registered class
  has, or a value of the wrong type, itself. :func:`refresh_entry_types` rebuilds them after a
  registration (the CLI calls it before building its parser); :func:`entry_dict` turns a parsed entry
  back into plain data (None fields dropped), which :func:`check_head_entry` then checks against the
  entry's own class.

Class choices are registry names (``name: classification``) or class paths, so every config serialises
as plain data (:meth:`LoRAConfig.as_dict`, :meth:`OptimConfig.as_dict`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jsonargparse.typing import restricted_string_type

from .errors import UsageError, closest
from .heads import get_head
from .heads.registry import HEADS
from .registry import entry_from_class_path
from .tokenizers.registry import MODALITIES, _hint_text, _init_hints, _type_ok, config_from_signature, get_modality

__all__ = [
    "HEAD_ENTRY_KEYS",
    "HeadEntry",
    "LoRAConfig",
    "OptimConfig",
    "TokenizerEntry",
    "check_entry_strings",
    "check_head_entry",
    "check_tokenizer_entry",
    "entry_dict",
    "head_config",
    "refresh_entry_types",
    "tokenizer_config",
]

#: keys of a head entry that are not the head class's options: which registry entry, what it reads,
#: which batch key is its target and its loss weight
HEAD_ENTRY_KEYS = ("name", "inputs", "target", "weight")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _from_mapping(cls: type, value: Any, where: str) -> Any:
    """``cls(**value)`` for a mapping, with unknown keys refused in one line naming the closest field."""
    if isinstance(value, cls):
        return value
    if hasattr(value, "as_dict"):  # a jsonargparse Namespace
        value = value.as_dict()
    if not isinstance(value, Mapping):
        raise UsageError(f"{where} is {value!r}", f"expected a mapping of {cls.__name__} fields {[f.name for f in dataclasses.fields(cls)]}",
                         f"write {where}: {{option: value}}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        hit = closest(unknown[0], names)
        raise UsageError(f"unknown {where} option(s) {unknown}", f"expected some of {names}" + (f" (did you mean {hit[0]!r}?)" if hit else ""),
                         "fix or drop them")
    return cls(**dict(value))


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters ``W x + (alpha / rank) B A x`` on the backbone's Linears (:mod:`mmte.lora`).

    Attributes:
        rank: the adapters' rank (a positive int).
        alpha: scale numerator: the update is ``alpha / rank`` times ``B A x``.
        dropout: dropout on the adapter's input, in [0, 1).
        lr_scale: the adapters' learning rate as a multiple of the model's (e.g. 0.1 for a pretrained trunk).
        targets: globs over the backbone's Linear names; None: QKV and the attention projection.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    lr_scale: float = 1.0
    targets: list[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive int; got {self.rank!r}")
        if not _number(self.alpha):
            raise UsageError(f"model.lora.alpha is {self.alpha!r}", "expected a number (the update is scaled by alpha / rank)", "set e.g. alpha: 16")
        if not _number(self.dropout) or not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"model.lora.dropout is {self.dropout!r}", "expected a number in [0, 1)", "set e.g. dropout: 0.0")
        if not _number(self.lr_scale) or not 0 < self.lr_scale < math.inf:
            raise ValueError(f"LoRA lr_scale must be a positive finite number (the adapters' lr = lr * lr_scale); got {self.lr_scale!r}")
        if self.targets is not None:
            if isinstance(self.targets, str) or not isinstance(self.targets, Sequence) or not all(isinstance(t, str) for t in self.targets):
                raise UsageError(f"model.lora.targets is {self.targets!r}", "expected a list of globs over the backbone's Linear names",
                                 "write e.g. targets: ['layers.*.self_attention.layernorm_qkv.linear']")
            object.__setattr__(self, "targets", list(self.targets))

    @classmethod
    def from_value(cls, value: Any) -> LoRAConfig | None:
        """A :class:`LoRAConfig` from a mapping (a recipe's ``lora:``), a config, or None/empty (no LoRA)."""
        if value is None or value is False or (isinstance(value, Mapping) and not value):
            return None
        return _from_mapping(cls, value, "model.lora")

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what a checkpoint stores and :func:`mmte.lora.apply_lora` takes as keyword arguments)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with warm-up then cosine (:mod:`mmte.training.optim`) and the training-time extras.

    Attributes:
        lr: peak learning rate.
        weight_decay: AdamW weight decay (not applied to norms, biases and embeddings).
        betas: AdamW betas.
        warmup: warm-up steps (int) or fraction of the total steps (float < 1).
        min_lr_ratio: the cosine schedule's final learning rate as a fraction of ``lr``.
        layer_decay: layer-wise learning-rate decay factor in (0, 1], or None.
        mixup: Beta(alpha, alpha) parameter of mixup on the training batches; 0: off.
        ema_decay: decay of the trainable weights' moving average, or None (off); checked by
            :func:`mmte.training.ema.check_decay`.
    """

    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    warmup: float = 0.05
    min_lr_ratio: float = 0.0
    layer_decay: float | None = None
    mixup: float = 0.0
    ema_decay: float | None = None

    def __post_init__(self) -> None:
        if not _number(self.mixup) or self.mixup < 0:
            raise ValueError(f"mixup must be a number >= 0 (the Beta(alpha, alpha) parameter; 0: off); got {self.mixup!r}")
        if self.layer_decay is not None and not 0.0 < self.layer_decay <= 1.0:
            raise ValueError(f"layer_decay must be in (0, 1] or None; got {self.layer_decay!r}")
        object.__setattr__(self, "betas", tuple(self.betas))

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what a checkpoint stores)."""
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------- entries
def _forwarding_chain(cls: type) -> list[type]:
    """``cls`` and, while an ``__init__`` forwards ``**kwargs`` to its parent, the parents whose options it takes."""
    chain = [cls]
    for base in cls.__mro__[1:]:
        params = inspect.signature(chain[-1].__init__).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params) or base.__init__ is chain[-1].__init__:
            break
        if base.__module__.startswith("torch."):
            break
        chain.append(base)
    return chain


def _forwarded_config(cls: type) -> type:
    """:func:`~mmte.tokenizers.registry.config_from_signature` of ``cls``, with the options its ``**kwargs``
    forwards to its parents (``AttentionPoolHead(dim, num_classes, **kwargs)`` takes ClassificationHead's)."""
    chain = _forwarding_chain(cls)
    if len(chain) == 1:
        return config_from_signature(cls)
    seen: dict[str, dataclasses.Field] = {}
    for c in chain:
        for f in dataclasses.fields(config_from_signature(c)):
            seen.setdefault(f.name, f)
    required = [(n, f.type) for n, f in seen.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    optional = [(n, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory)) for n, f in seen.items()
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    return dataclasses.make_dataclass(f"{cls.__name__}Config", required + optional, frozen=True)


def _hints(cls: type) -> dict[str, Any]:
    """``cls.__init__``'s annotations, with those of the parents its ``**kwargs`` forwards to."""
    out: dict[str, Any] = {}
    for c in reversed(_forwarding_chain(cls)):
        out.update(_init_hints(c))
    return out


def head_config(name: str) -> type:
    """The config dataclass of the head registered as ``name`` (or a class path): its keyword arguments
    except ``dim``, plus the entry keys :data:`HEAD_ENTRY_KEYS`.

    Raises:
        UnknownHeadError: (a ``ValueError``) for an unknown name, listing the registered heads.
    """
    cls = get_head(name)
    own = _forwarded_config(cls)
    extra = [("name", str, dataclasses.field(default=name)), ("inputs", Any, dataclasses.field(default=None)),
             ("target", Any, dataclasses.field(default=None)), ("weight", float, dataclasses.field(default=1.0))]
    return dataclasses.make_dataclass(f"{cls.__name__}Entry", extra, bases=(own,), frozen=True)


def tokenizer_config(name: str) -> type:
    """The config dataclass of the modality registered as ``name`` (or a class path): its tokenizer's
    keyword arguments except ``dim`` (the one :func:`mmte.tokenizers.register_modality` keeps).

    Raises:
        UnknownModalityError: (a ``ValueError``) for an unknown name, listing the registered modalities.
    """
    return get_modality(name).config


def _check_options(what: str, cls: type, options: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """Refuse options ``cls.__init__`` does not take, and values of a type its annotation rules out."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        names = sorted(allowed)
        hit = closest(unknown[0], names)
        raise UsageError(f"unknown {what} option(s) {unknown}", f"expected some of {names}" + (f" (did you mean {hit[0]!r}?)" if hit else ""),
                         "fix or drop them")
    hints = _hints(cls)
    for k, v in options.items():
        hint = hints.get(k)
        if hint is not None and not _type_ok(v, hint):
            raise UsageError(f"{what} option {k} is {v!r} (a {type(v).__name__})", f"expected {_hint_text(hint)}",
                             "no quotes: a quoted number is a string" if isinstance(v, str) else "see the class's docstring")


def check_head_entry(key: str, entry: Mapping[str, Any]) -> None:
    """Validate head ``key``'s recipe entry against its head's config (:func:`head_config`): option names
    and, where the class annotates them, types. An entry without ``name`` (a modality's default head) is
    checked when it is built.

    Raises:
        UsageError: an unknown option or a value of the wrong type, in one line naming both.
        UnknownHeadError: an unknown head name.
    """
    cfg = dict(entry_from_class_path(entry))
    name = cfg.get("name")
    if not isinstance(name, str):
        return
    cls = get_head(name)
    options = {k: v for k, v in cfg.items() if k not in HEAD_ENTRY_KEYS}
    if cls.multi_input:
        options.pop("modalities", None)  # filled from inputs by the model
    if cls.task == "forecasting" and options.get("num_patches") in ("auto", "mean"):
        options.pop("num_patches")  # computed from the data, or the mean-pool head (mmte.training.model_spec)
    allowed = [f.name for f in dataclasses.fields(head_config(name)) if f.name not in HEAD_ENTRY_KEYS]
    _check_options(f"model.heads.{key} ({name})", cls, options, allowed)


def check_tokenizer_entry(key: str, entry: str | Mapping[str, Any]) -> None:
    """Validate tokenizer ``key``'s recipe entry against its modality's config (:func:`tokenizer_config`).

    Raises:
        UsageError: an unknown option or a value of the wrong type, in one line naming both.
        UnknownModalityError: an unknown modality name.
    """
    if isinstance(entry, str):
        get_modality(entry)
        return
    cfg = dict(entry_from_class_path(entry))
    modality = get_modality(cfg.pop("name", key))
    cfg.pop("dim", None)  # refused when the tokenizer is built, naming the backbone's width
    modality.make_config(**cfg)


# ------------------------------------------------------------------------- the parser's entry types
#: values an option takes besides its class's annotation, because the data fills them in later
#: (:func:`mmte.training.model_spec.apply_data_info`)
DATA_FILLED = {"num_patches": Literal["auto", "mean"]}

#: a registry name or class path (``image``, ``pkg.mod.Class``, ``pkg.mod:Class``): a tokenizer entry's short form
RegistryName = restricted_string_type("RegistryName", r"^[A-Za-z_][\w.:]*$")

#: the head entry keys that are not options of the head class, with their types
_HEAD_KEYS = {"inputs": str | list[str], "target": str, "weight": float}


def _option_types(classes: Sequence[type], fields_of) -> dict[str, Any]:
    """``{option: annotation}`` over ``classes``: each option typed as its classes annotate it (a Union where
    they differ, ``Any`` where one does not annotate it), plus :data:`DATA_FILLED`."""
    seen: dict[str, list[Any]] = {}
    for cls in classes:
        hints = _hints(cls)
        for name in fields_of(cls):
            seen.setdefault(name, []).append(hints.get(name, Any))
    out: dict[str, Any] = {}
    for name, hints in seen.items():
        if name in DATA_FILLED:
            hints = [*hints, DATA_FILLED[name]]
        uniq = list(dict.fromkeys(hints))
        out[name] = Any if Any in uniq else (uniq[0] if len(uniq) == 1 else typing.Union[tuple(uniq)])  # noqa: UP007 - built from a list
    return out


def _entry_type(cls_name: str, doc: str, types: Mapping[str, Any]) -> type:
    fields_ = [(k, t if t is Any else t | None, dataclasses.field(default=None)) for k, t in types.items()]
    cls = dataclasses.make_dataclass(cls_name, [("name", str | None, dataclasses.field(default=None)), *fields_])
    cls.__module__, cls.__doc__ = __name__, doc  # the parser imports it by this path
    return cls


def refresh_entry_types() -> tuple[type, type]:
    """Rebuild :data:`HeadEntry` and :data:`TokenizerEntry` from the heads and modalities registered now
    (built-ins, entry points, and class paths resolved so far).

    Returns:
        ``(HeadEntry, TokenizerEntry)``.
    """
    global HeadEntry, TokenizerEntry, _registered
    heads = [cls for _, cls in HEADS.items()]
    specs = [spec for _, spec in MODALITIES.items()]
    now = (tuple(heads), tuple((s.tokenizer, s.config) for s in specs))
    if now == _registered:  # the same classes: keep the types a parser built earlier holds
        return HeadEntry, TokenizerEntry
    _registered = now
    head_opts = _option_types(heads, lambda c: [f.name for f in dataclasses.fields(_forwarded_config(c))])
    for k in HEAD_ENTRY_KEYS:
        head_opts.pop(k, None)
    HeadEntry = _entry_type(
        "HeadEntry",
        "A ``model.heads`` entry: ``name`` (a registered head or a class path; None: the modality's default head), "
        "``inputs``, ``target``, ``weight`` and the head's options (None: not set).",
        {**_HEAD_KEYS, **head_opts},
    )
    tok_opts = _option_types([s.tokenizer for s in specs], lambda c: [])
    for s in specs:
        hints = _init_hints(s.tokenizer)
        for f in dataclasses.fields(s.config):
            t = hints.get(f.name, Any)
            old = tok_opts.get(f.name)
            tok_opts[f.name] = t if old is None or old == t else (Any if Any in (old, t) else old | t)
    tok_opts.pop("name", None)
    tok_opts["dim"] = int  # refused by the model with the backbone's width in the message
    TokenizerEntry = _entry_type(
        "TokenizerEntry",
        "A ``model.tokenizers`` entry: ``name`` (a registered modality or a class path; None: the entry's key) and "
        "the tokenizer's options (None: not set).",
        tok_opts,
    )
    return HeadEntry, TokenizerEntry


def check_entry_strings(section: str, key: str, entry: Any) -> None:
    """Refuse a string where the entry's class annotates an option without ``str`` (``patch_size: '4'``), in the
    line :func:`check_tokenizer_entry` / :func:`check_head_entry` give: the parser would read it as the number.
    For a recipe's raw entries, before parsing; unknown names and options are left to the parser and the checks.

    Raises:
        UsageError: naming the option, its value and the type expected.
    """
    if not isinstance(entry, Mapping):
        return
    name = entry.get("name", key if section == "tokenizers" else None)
    if not isinstance(name, str):
        return
    try:
        cls = get_head(name) if section == "heads" else get_modality(name).tokenizer
    except ValueError:
        return  # an unknown name: the model's check names it
    hints = _hints(cls)
    for k, v in entry.items():
        hint = hints.get(k)
        if not isinstance(v, str) or hint is None or _type_ok(v, hint) or (k in DATA_FILLED and _type_ok(v, DATA_FILLED[k])):
            continue
        if section == "heads":
            raise UsageError(f"model.heads.{key} ({name}) option {k} is {v!r} (a str)", f"expected {_hint_text(hint)}",
                             "no quotes: a quoted number is a string")
        fix = f"write {k}: {v}" if v.strip().lstrip("-").replace(".", "", 1).isdigit() else "see the tokenizer's docstring"
        raise UsageError(f"{get_modality(name).name} tokenizer option {k} is {v!r} (a str)", f"expected {_hint_text(hint)}",
                         fix + " (no quotes: a quoted number is a string)")


def entry_dict(entry: Any) -> Any:
    """A parsed entry (a :data:`HeadEntry` / :data:`TokenizerEntry`, a jsonargparse Namespace or a mapping) as
    plain data without its unset (None) fields; a string or a ready module unchanged."""
    if dataclasses.is_dataclass(entry) and not isinstance(entry, type):
        entry = {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry)}
    elif hasattr(entry, "as_dict") and not isinstance(entry, Mapping):
        entry = entry.as_dict()
    if not isinstance(entry, Mapping):
        return entry
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in entry.items() if v is not None}


_registered: tuple = ()  # the classes the entry types were built from
#: the ``model.heads`` entry type the parser reads (rebuilt by :func:`refresh_entry_types`)
HeadEntry: type
#: the ``model.tokenizers`` entry type the parser reads (rebuilt by :func:`refresh_entry_types`)
TokenizerEntry: type
refresh_entry_types()
