"""The recipe checks the fit-family verbs make before anything is built, and the run header.

They turn values Lightning or jsonargparse would reject with a traceback or a usage dump into
one :class:`~mmte.errors.UsageError` line: the ``--config`` files, the trainer's devices, accelerator
and strategy, a writable output folder. :func:`resolve_precision` maps ``precision`` onto
``trainer.precision`` and logs the run header; :func:`resolve_predict_dtype` lets an explicit
precision decide the inference copy's dtype.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Mapping
from typing import Any

from ..errors import UnknownNameError, UsageError, closest
from ._util import plain, warn

__all__ = [
    "LIGHTNING_COMMANDS",
    "check_config_files",
    "check_strategy",
    "check_trainer_options",
    "check_writable",
    "init_args",
    "resolve_model_entries",
    "resolve_precision",
    "resolve_predict_dtype",
    "warn_untrained",
]

logger = logging.getLogger("mmte")

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def init_args(obj: Any) -> dict[str, Any]:
    """The constructor arguments of a callback that differ from their defaults (for ``--print_config``)."""
    import inspect

    out = {}
    for name, p in inspect.signature(type(obj).__init__).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        for attr in (name, f"_{name}"):
            if hasattr(obj, attr):
                v = getattr(obj, attr)
                if isinstance(v, (int, float, str, bool, type(None))) and v != p.default:
                    out[name] = v
                break
    return out


def resolve_model_entries(model: Any) -> None:
    """Tokenizer and head entries given by ``class_path`` (jsonargparse parses them into Namespaces) become
    plain dicts again, and every class path or registry name among them is resolved now: importing a user's
    module (on PYTHONPATH) registers its modalities and heads before the data module looks them up."""
    from ..heads import get_head
    from ..registry import entry_from_class_path
    from ..tokenizers.registry import get_modality

    if model is None or not hasattr(model, "get"):
        return
    for section, resolve in (("tokenizers", get_modality), ("heads", get_head)):
        entries = model.get(section)
        if not entries:
            continue
        resolved = {k: plain(v) for k, v in plain(entries).items()}
        for entry in resolved.values():
            init = entry.get("init_args") if isinstance(entry, dict) else None
            if isinstance(init, dict) and "dim" in init and init["dim"] is None:
                del init["dim"]  # jsonargparse lists the constructor's width; the backbone sets it
            name = entry if isinstance(entry, str) else entry_from_class_path(entry).get("name") if isinstance(entry, Mapping) else None
            if isinstance(name, str) and ("." in name or ":" in name):
                resolve(name)
        model[section] = resolved


def resolve_precision(c: Any, argv: list[str] = ()) -> None:
    """Map the top-level ``precision`` (``auto`` or a Lightning value) onto ``trainer.precision`` and log
    the run header: CPU, the flags that matter, threads, and the precision chosen (and why).

    An explicit ``--trainer.precision`` on the command line wins over a recipe's ``precision`` (both on
    the command line with different values is an error)."""
    from .. import device as mdev

    want = c.get("precision")
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if "--trainer.precision" in given and want is not None:
        if "--precision" in given and str(want) != str(c.trainer.precision):
            raise UsageError(f"--precision {want} and --trainer.precision {c.trainer.precision} disagree", "expected one of them", "drop one")
        want = None  # the command line's trainer.precision over the recipe's precision
    plugins = c.trainer.get("plugins") or []
    plugins = plugins if isinstance(plugins, list) else [plugins]
    owner = next((p for p in plugins if "precision" in str(getattr(p, "class_path", p)).lower()), None)
    if owner is not None and want is not None:
        # a precision plugin (e.g. configs/precision/fp8-*.yaml) decides; 'precision' would clash with it
        logger.info("precision %s: %s decides (from trainer.plugins)", want, getattr(owner, "class_path", owner))
        want = None
    dev = _run_device(c)
    why = "trainer.precision"
    if want is not None:
        if want == "auto":
            prec, reason = mdev.choose_precision(dev)
            why = f"auto: {reason}"
        else:
            prec, why = want, "precision"
        c.trainer.precision = prec
    header = mdev.describe() if dev == "cpu" else f"device {mdev.info(dev).name}"
    if owner is not None:
        prec, why = str(getattr(owner, "class_path", owner)).rsplit(".", 1)[-1], "trainer.plugins"
    else:
        prec = c.trainer.precision or "32-true"
    logger.info("%s, precision %s (%s)", header, prec, why)


def _run_device(c: Any) -> str:
    """The device type a run of config ``c`` uses (``cpu``, ``cuda``, ``musa``)."""
    from .. import device as mdev

    accel = str(c.trainer.accelerator or "auto")
    return "cpu" if accel == "cpu" or not any(mdev.is_available(t) for t in ("cuda", "musa")) else mdev.default_device().type


def _explicit_precision(c: Any, argv: list[str]) -> tuple[str, str] | None:
    """``(flag, value)`` of a precision given on the command line (``--trainer.precision``, or ``--precision``
    other than ``auto``), read after :func:`resolve_precision`; None when the recipe decides."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if "--trainer.precision" in given:
        return "--trainer.precision", str(c.trainer.precision)
    if "--precision" in given and c.get("precision") not in (None, "auto"):
        return "--precision", str(c.precision)
    return None


def _dtype_of_precision(precision: str) -> str | None:
    """The inference dtype a Lightning precision implies: ``bf16-*`` -> bf16, ``32``/``64`` -> fp32, else None."""
    if precision.startswith("bf16"):
        return "bf16"
    if precision in ("32", "32-true", "64", "64-true"):
        return "fp32"
    return None


def resolve_predict_dtype(c: Any, argv: list[str], verb: str | None) -> None:
    """For ``predict``: settle the dtype of the inference copy predictions run on, and log it with how to change it.

    With ``model.predict_dtype: auto``, a precision given on the command line decides (``32-true`` -> fp32,
    ``bf16-*`` -> bf16); otherwise ``auto`` picks bf16 where the device has native bf16, else fp32. An
    explicit ``--model.predict_dtype`` always wins.
    """
    model = c.get("model")
    if verb != "predict" or model is None or not hasattr(model, "get") or model.get("predict_dtype") is None:
        return
    from ..inference import resolve_dtype

    dtype = str(model.predict_dtype)
    given = _explicit_precision(c, argv)
    implied = _dtype_of_precision(given[1]) if given else None
    if dtype == "auto" and implied is not None:
        model.predict_dtype = dtype = implied
        why = f"from {given[0]} {given[1]}"
    elif dtype == "auto":
        why = "predict_dtype auto: bf16 where the device has native bf16, else fp32"
    else:
        why = f"predict_dtype {dtype}"
    logger.info("predictions in %s (%s); --model.predict_dtype fp32 or bf16 sets it", resolve_dtype(dtype, _run_device(c)), why)


def check_trainer_options(t: Any) -> None:
    """Trainer values Lightning would reject with a traceback: devices, accelerator."""
    dev = t.get("devices")
    bad = False
    if isinstance(dev, bool):
        bad = True
    elif isinstance(dev, int):
        bad = dev == 0 or dev < -1
    elif isinstance(dev, str) and dev.strip().lstrip("-").isdigit():
        bad = int(dev) == 0 or int(dev) < -1
    elif isinstance(dev, (list, tuple)):
        bad = len(dev) == 0
    if bad:
        raise UsageError(f"--trainer.devices is {dev!r}", "expected a positive number of devices, a list of device ids, -1 (all) or 'auto'",
                         "set --trainer.devices 1")
    acc = t.get("accelerator")
    name = acc if isinstance(acc, str) else None
    if name in ("gpu", "cuda", "musa"):
        from .. import device as mdevice

        here = [t for t in mdevice.available_types() if t != "cpu"]
        if (name == "gpu" and not here) or (name != "gpu" and name not in here):
            raise UsageError(f"--trainer.accelerator is {name!r} but this machine has no such device (found: {', '.join(here) or 'CPU only'})",
                             "expected an accelerator that is present", "set --trainer.accelerator auto (or cpu)")


def check_strategy(strategy: Any) -> None:
    """A strategy given by name must be one Lightning knows (its own message is a paragraph)."""
    if not isinstance(strategy, str) or strategy == "auto":
        return
    from lightning.pytorch.strategies import StrategyRegistry

    from ..training import strategy as _registers_mmte_strategies  # noqa: F401 - mmte, mmte_tp2, ... are registered on import

    known = ["auto", *StrategyRegistry.available_strategies()]
    if strategy not in known:
        raise UnknownNameError("strategy", strategy, known, "or stack a configs/parallel/*.yaml fragment (e.g. ddp.yaml, tp2.yaml)")


def check_writable(root: str, flag: str) -> None:
    """The output folder (or the nearest folder above it that exists) must accept new files."""
    import tempfile

    probe = os.path.abspath(root)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise UsageError(f"{flag} {root} is inside {probe}, which is a file", "expected a folder path", f"choose another {flag}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mmte-write-test-", dir=probe))
    except OSError as e:
        raise UsageError(f"{flag} {root} cannot be written ({probe}: {e.strerror or e})", "expected a writable folder for logs and checkpoints",
                         f"choose another {flag} (or fix the folder's permissions)") from None


def warn_untrained(command: str, model: Any) -> None:
    m = plain(model) or {}
    heads = ", ".join(sorted((m.get("heads") or {}).keys())) or "the heads"
    src = m.get("backbone_weights")
    backbone = (f"only the backbone has pretrained weights ({src}); " if src else "the backbone too has no pretrained weights; ")
    warn(f"{command} without --ckpt_path: the heads ({heads}) and tokenizers are randomly initialised ({backbone}the output is "
          f"meaningless). Pass --ckpt_path best (or a .ckpt written by mmte fit)")


def _config_paths(argv: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(argv):
        if a in ("--config", "-c") and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--config="):
            out.append(a.split("=", 1)[1])
    return out


def check_config_files(argv: list[str]) -> None:
    """Every ``--config`` file exists, is not empty and holds a YAML mapping (jsonargparse's messages for
    these are a usage dump); an unknown recipe name gets the closest existing file."""
    import yaml

    for p in _config_paths(argv):
        if not os.path.isfile(p):
            here = os.path.dirname(p) or "."
            pool = sorted(glob.glob(os.path.join(here, "*.yaml")) + glob.glob(os.path.join(here, "*.yml"))) if os.path.isdir(here) else []
            if not pool:
                pool = sorted(glob.glob(os.path.join("recipes", "*.yaml")) + glob.glob(os.path.join("configs", "*", "*.yaml")))
            hit = closest(p, pool)
            known = ", ".join(os.path.basename(x) for x in pool[:12]) + (" ..." if len(pool) > 12 else "")
            raise UsageError(f"--config {p} does not exist", f"expected a recipe or fragment YAML file{f' (in {here}: {known})' if pool else ''}",
                             f"did you mean {hit[0]}?" if hit else "check the path (recipes/ holds the recipes, configs/ the fragments)")
        with open(p, encoding="utf-8") as fh:
            text = fh.read()
        if not text.strip() or all(ln.strip().startswith("#") or not ln.strip() for ln in text.splitlines()):
            raise UsageError(f"--config {p} is empty", "expected a YAML mapping such as recipes/quickstart.yaml (trainer:, model:, data:)",
                             "fill it in or drop this --config")
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise UsageError(f"--config {p} is not valid YAML ({getattr(e, 'problem', None) or e}{where})", "expected a YAML mapping",
                             "fix the file (indentation, colons, quotes)") from None
        if not isinstance(doc, dict):
            raise UsageError(f"--config {p} holds a {type(doc).__name__}, not a mapping", "expected keys such as trainer:, model:, data:",
                             "see recipes/quickstart.yaml for the layout")
