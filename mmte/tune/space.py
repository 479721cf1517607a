"""The search space of ``mmte tune``: a YAML mapping from recipe keys to ranges or choices.

::

    model.lr: {log: [1.0e-4, 1.0e-2]}            # a float drawn on a log scale
    model.heads.digit.dropout: [0.0, 0.5]         # a float, uniformly
    trainer.max_epochs: {int: [2, 8]}             # an int (both ends included)
    model.freeze: {choice: [backbone, none]}      # one of the listed values
    model.weight_decay: {float: [0.0, 0.1], step: 0.01}

Each entry becomes an Optuna distribution (``FloatDistribution``, ``IntDistribution``,
``CategoricalDistribution``), and a trial passes its values to ``mmte fit`` as ``--<key> <value>``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError

__all__ = ["cli_value", "load_space", "parse_space", "suggest"]

_FORMS = "{log: [lo, hi]}, {float: [lo, hi]}, [lo, hi], {int: [lo, hi]} or {choice: [a, b, ...]}"


def load_space(path: str) -> dict[str, Any]:
    """Read and parse the space file ``path`` (see :func:`parse_space`)."""
    import yaml

    if not os.path.isfile(path):
        raise UsageError(f"--tune.space {path} does not exist", "expected a YAML file mapping recipe keys to ranges", "e.g. model.lr: {log: [1e-4, 1e-2]}")
    with open(path, encoding="utf-8") as fh:
        try:
            doc = yaml.safe_load(fh)
        except yaml.YAMLError as e:
            raise UsageError(f"--tune.space {path} is not valid YAML ({getattr(e, 'problem', None) or e})", "expected a mapping of recipe keys") from None
    return parse_space(doc, path)


def _bounds(key: str, value: Any, where: str) -> tuple[Any, Any]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise UsageError(f"{where}: {key} range {value!r} is not two numbers", f"expected {_FORMS}")
    lo, hi = value
    if not lo < hi:
        raise UsageError(f"{where}: {key} range [{lo}, {hi}] is empty", "expected low < high", f"write {key}: [{min(lo, hi)}, {max(lo, hi)}] with two different ends")
    return lo, hi


def parse_space(doc: Any, where: str = "--tune.space") -> dict[str, Any]:
    """``{recipe key: optuna distribution}`` from a parsed space mapping; an impossible entry is one UsageError."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not isinstance(doc, Mapping) or not doc:
        raise UsageError(f"{where} holds {type(doc).__name__ if doc is not None else 'nothing'}", "expected a mapping of recipe keys to ranges",
                         "e.g. model.lr: {log: [1e-4, 1e-2]}")
    out: dict[str, Any] = {}
    for key, spec in doc.items():
        if not isinstance(key, str) or not key or key.startswith(("-", "tune.")):
            raise UsageError(f"{where}: key {key!r} is not a recipe key", "expected a dotted key such as model.lr or trainer.max_epochs")
        if isinstance(spec, (list, tuple)):
            out[key] = FloatDistribution(*map(float, _bounds(key, spec, where)))
            continue
        if not isinstance(spec, Mapping):
            raise UsageError(f"{where}: {key} is {spec!r}", f"expected {_FORMS}")
        kinds = [k for k in ("log", "float", "int", "choice") if k in spec]
        extra = set(spec) - {"log", "float", "int", "choice", "step"}
        if len(kinds) != 1 or extra:
            raise UsageError(f"{where}: {key} is {dict(spec)!r}", f"expected exactly one of {_FORMS} (and an optional step)")
        kind, step = kinds[0], spec.get("step")
        if kind == "choice":
            choices = spec["choice"]
            if not isinstance(choices, (list, tuple)) or not choices or step is not None:
                raise UsageError(f"{where}: {key} choice {choices!r} is empty or not a list", "expected {choice: [a, b, ...]} with at least one value")
            out[key] = CategoricalDistribution(list(choices))
            continue
        lo, hi = _bounds(key, spec[kind], where)
        if kind == "log" and lo <= 0:
            raise UsageError(f"{where}: {key} log range [{lo}, {hi}] reaches {lo}", "expected a log range above 0", f"use {key}: [lo, hi] for a linear range")
        if step is not None and (not isinstance(step, (int, float)) or isinstance(step, bool) or step <= 0 or kind == "log"):
            raise UsageError(f"{where}: {key} step {step!r}", "expected a number > 0, on an int or float range (not log)")
        if kind == "int":
            if int(lo) != lo or int(hi) != hi or (step is not None and int(step) != step):
                raise UsageError(f"{where}: {key} int range [{lo}, {hi}] has a fraction", "expected whole numbers")
            out[key] = IntDistribution(int(lo), int(hi), step=int(step or 1))
        else:
            out[key] = FloatDistribution(float(lo), float(hi), log=kind == "log", step=None if step is None else float(step))
    return out


def suggest(trial: Any, key: str, dist: Any) -> Any:
    """The trial's value of ``key`` drawn from ``dist`` (Optuna's ``suggest_*``)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(key, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)


def first_value(dist: Any) -> Any:
    """A value inside ``dist`` (its low end, or first choice): what the pre-flight parse uses."""
    return dist.choices[0] if hasattr(dist, "choices") else dist.low


def cli_value(value: Any) -> str:
    """``value`` as a command-line value the recipe parser reads back as the same YAML value."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    import json

    return json.dumps(value)
