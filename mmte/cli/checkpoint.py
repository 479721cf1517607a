"""``--ckpt_path``: ``best`` / ``last`` resolved the same way for every verb, the file checked and opened once,
and the model's hyperparameters taken from it.

``best`` and ``last`` name ``<checkpoint folder>/best.ckpt`` and ``last.ckpt``, the files
:class:`~mmte.training.callbacks.MMTECheckpoint` writes; the folder is ``checkpoint.dirpath``, else
``<trainer.default_root_dir>/checkpoints``. A checkpoint defines the model it was trained as: an explicit
``--model.*`` flag must agree with its hyperparameters unless it is one of :data:`CKPT_OVERRIDABLE`.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

from ..errors import UsageError
from ._util import plain, short, warn

__all__ = [
    "CKPT_OVERRIDABLE",
    "apply_checkpoint_hparams",
    "check_checkpoint_fits",
    "checkpoint_dir",
    "load_checkpoint",
    "resolve_ckpt_path",
    "single_process_checkpoint",
]

logger = logging.getLogger("mmte")

#: ``--model.*`` flags that may differ from a ``--ckpt_path`` checkpoint's hyperparameters: they change
#: where the frozen weights are read from (checked against the checkpoint's fingerprint) or how
#: inference runs, not what was trained. Any other explicit ``--model.*`` flag must agree.
CKPT_OVERRIDABLE = ("backbone_weights", "fuse_for_inference", "predict_dtype", "save_frozen")

#: the names ``--ckpt_path`` accepts besides a path
NAMED = ("best", "last")


def checkpoint_dir(config: Any) -> str:
    """The folder ``best`` / ``last`` live in, from a parsed recipe (``checkpoint.dirpath``, else
    ``<trainer.default_root_dir>/checkpoints``, the root defaulting to ``runs/mmte``)."""
    root = config.trainer.default_root_dir or os.path.join("runs", "mmte")
    return config.checkpoint.dirpath or os.path.join(root, "checkpoints")


def resolve_ckpt_path(value: str | None, folder: str, verb: str) -> str | None:
    """The checkpoint a verb's ``--ckpt_path`` names: ``best`` / ``last`` -> ``<folder>/{best,last}.ckpt``.

    Every verb that takes a checkpoint (fit, validate, test, predict, export) resolves it here.

    Args:
        value: the ``--ckpt_path`` value (``best``, ``last``, a path, or None).
        folder: the run's checkpoint folder (:func:`checkpoint_dir`).
        verb: the command, for the messages; ``fit --ckpt_path last`` without a checkpoint starts from scratch.

    Returns:
        the path (other values unchanged), or None where ``fit`` has no ``last`` to resume from.

    Raises:
        UsageError: ``best`` / ``last`` where that file does not exist.
    """
    if value not in NAMED:
        return value
    f = os.path.join(folder, f"{value}.ckpt")
    if os.path.exists(f):
        return f
    if verb == "fit" and value == "last":
        warn(f"--ckpt_path last: there is no {f} yet, so training starts from scratch")
        return None
    raise UsageError(f"--ckpt_path {value}: there is no {f}", f"expected the {value} checkpoint of an earlier mmte fit with this default_root_dir",
                     "run mmte fit first, or pass --ckpt_path <file>")


def single_process_checkpoint(ckpt: str | None, root: str) -> str | None:
    """``ckpt`` itself, or, for a distributed checkpoint folder, a portable file consolidated from it
    under ``root`` (what ``mmte convert`` writes), so that one process can load any checkpoint."""
    if not ckpt or not os.path.isdir(str(ckpt)):
        return ckpt
    from ..training.portable import consolidate

    out = os.path.join(root, f"{os.path.basename(os.path.normpath(str(ckpt)))}.consolidated.ckpt")
    consolidate(ckpt, out)
    logger.info("consolidated the distributed checkpoint %s into %s for this single-process run", ckpt, out)
    return out


def explicit_model_flags(argv: list[str]) -> list[str]:
    """Top-level ``model`` keys given as command-line flags (``--model.lr 0.1``, ``--model.heads={...}``)."""
    keys = []
    for a in argv:
        if a.startswith("--model.") and len(a) > len("--model."):
            keys.append(a[len("--model.") :].split("=", 1)[0].split(".", 1)[0])
    return list(dict.fromkeys(keys))


def load_checkpoint(path: str, folder: str) -> dict[str, Any] | None:
    """Open a ``--ckpt_path`` file once (memory-mapped, weights only) or say in one line why it cannot be used.

    A distributed checkpoint (a folder) is left to the strategy (None)."""
    import zipfile

    import torch

    if os.path.isdir(path):
        return None
    if not os.path.isfile(path):
        hint = sorted(glob.glob(os.path.join(folder, "*.ckpt")))
        raise UsageError(f"--ckpt_path {path} does not exist", "expected a checkpoint file written by mmte fit (or best / last)",
                         f"pass one of {[os.path.basename(h) for h in hint][:6]} in {folder}" if hint else "run mmte fit first")
    if not zipfile.is_zipfile(path):
        raise UsageError(f"--ckpt_path {path} is not a complete checkpoint (truncated, or not written by torch.save; {os.path.getsize(path)} bytes)",
                         "expected a .ckpt file written by mmte fit", f"use another checkpoint (e.g. {os.path.join(folder, 'best.ckpt')}) or train again")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - any reader error means the file is unusable
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"--ckpt_path {path} cannot be read ({type(e).__name__}: {first[:160]})",
                         "expected a .ckpt file written by mmte fit (mmte never unpickles arbitrary objects)",
                         "use another checkpoint or train again") from None


def apply_checkpoint_hparams(parser: Any, config: Any, sub: str, ckpt: dict[str, Any] | None, path: str, argv: list[str]) -> Any:
    """``config`` with ``<sub>.model`` taken from the checkpoint's hyperparameters.

    An explicit ``--model.*`` flag in ``argv`` that disagrees with them is an error, unless it is one of
    :data:`CKPT_OVERRIDABLE` (then the flag's value is kept).
    """
    hparams = dict((ckpt or {}).get("hyper_parameters") or {})
    hparams.pop("_instantiator", None)
    if not hparams:
        return config
    if "_class_path" in hparams:  # a LightningModule subclass saved by LightningCLI (as Lightning does it)
        hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        return parser.parse_object({sub: {"model": hparams}}, config)
    hparams = _typed_entries(hparams)
    mine = _typed_entries(plain(config[sub].get("model")) or {})
    keep = {}
    for key in explicit_model_flags(argv):
        if key not in hparams or key not in mine or plain(mine[key]) == plain(hparams[key]):
            continue
        if key in CKPT_OVERRIDABLE:
            keep[key] = mine[key]
            continue
        raise UsageError(
            f"--model.{key} is {short(mine[key])} but the checkpoint {path} was trained with {short(hparams[key])}",
            "expected --model flags that agree with --ckpt_path (the checkpoint defines the model; only "
            f"{', '.join(CKPT_OVERRIDABLE)} may differ)",
            f"drop --model.{key}, or train a model with it (mmte fit)",
        )
    config = parser.parse_object({sub: {"model": hparams}}, config)
    for key, value in keep.items():
        config[sub].model[key] = value
    return config


def _typed_entries(model: dict[str, Any]) -> dict[str, Any]:
    """``model`` with its tokenizer and head entries as the typed configs store them: plain data without unset
    options, class paths as ``name`` (an older checkpoint's ``{class_path, init_args}`` too), the classes they
    name imported and the parser's entry types rebuilt with them (:func:`mmte.config.refresh_entry_types`)."""
    from ..config import entry_dict, refresh_entry_types
    from ..heads import get_head
    from ..registry import entry_from_class_path
    from ..tokenizers.registry import get_modality

    model = dict(model)
    for section, resolve in (("tokenizers", get_modality), ("heads", get_head)):
        entries = model.get(section)
        if not isinstance(entries, dict):
            continue
        model[section] = {k: entry_dict(entry_from_class_path(plain(v))) for k, v in entries.items()}
        for entry in model[section].values():
            name = entry.get("name") if isinstance(entry, dict) else entry
            if isinstance(name, str) and ("." in name or ":" in name):
                resolve(name)
    refresh_entry_types()
    return model


def check_checkpoint_fits(module: Any, ckpt: dict[str, Any], path: str) -> None:
    """Compare the checkpoint's tensor shapes with the model's (built on the meta device): a head trained
    for another number of classes fails here, naming the tensor, not in ``load_state_dict``."""
    sd = ckpt.get("state_dict") or {}
    if not sd or not hasattr(module, "_build"):
        return
    from ..training.module import quiet_model_logs

    with quiet_model_logs():
        meta = module._build(device="meta", with_weights=False)
    own = {f"model.{k}": tuple(v.shape) for k, v in meta.state_dict().items()}
    bad = [(k, tuple(v.shape), own[k]) for k, v in sd.items() if k in own and hasattr(v, "shape") and tuple(v.shape) != own[k]]
    if bad:
        k, theirs, mine = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        info = (ckpt.get("hyper_parameters") or {}).get("data_info") or {}
        why = f"; it was trained on data with {', '.join(f'{n}={info[n]}' for n in ('num_classes', 'out_dim', 'horizon') if n in info)}" if info else ""
        raise UsageError(f"checkpoint {path} does not fit this model: {k} is {list(theirs)} in the checkpoint but {list(mine)} here{more}{why}",
                         "expected the recipe and data the checkpoint was trained with (e.g. the same classes)",
                         "point --data at that data, or train a new model on this data with mmte fit")
