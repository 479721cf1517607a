"""The ``mmte`` command: Lightning's CLI for recipes, plus ``modalities`` and ``convert``.

::

    mmte fit      --config recipes/quickstart.yaml [--config configs/encoders/tiny.yaml ...] [--trainer.max_epochs 3]
    mmte validate --config recipes/quickstart.yaml --ckpt_path best        # runs/quickstart/checkpoints/best.ckpt
    mmte test     --config ... --ckpt_path ...
    mmte predict  --config recipes/quickstart.yaml --ckpt_path best [--prediction_writer.output preds.json]
    mmte fit      --config recipes/quickstart.yaml --ckpt_path last          # resume
    mmte fit      --config recipes/quickstart.yaml --print_config            # the merged configuration
    mmte list [modalities|heads|presets|sources|strategies|recipes|fragments]  # names, one line each
    mmte modalities                                                          # registered modalities (table)
    mmte convert  --from hf /path/to/bert --out bert.safetensors             # weights -> mmte file
    mmte export   --config recipes/quickstart.yaml --ckpt_path last.ckpt --format onnx --out model.onnx
    mmte env                                                                 # versions, device, CPU flags
    mmte fit      --config recipes/quickstart.yaml --precision auto          # bf16 where the CPU has it

Defaults the recipes build on: a progress bar, a CSV logger in ``<default_root_dir>/logs/version_N``
(config.yaml beside it), :class:`~mmte.training.callbacks.MMTECheckpoint` writing
``<default_root_dir>/checkpoints/last.ckpt`` (the latest step, rewritten at every save) and
``best.ckpt`` (the best by the model's main validation metric), a learning-rate monitor, the
:class:`~mmte.training.guards.TrainingGuard` (a non-finite loss stops the run; SIGINT/SIGTERM save
``last.ckpt`` at the next step boundary and stop), and the data's ``model_info`` (classes, channels,
horizon...) linked into ``model.data_info``. ``--ckpt_path best`` / ``last`` name those two files, in any
process.

Errors (:mod:`mmte.errors`): a mistake stops the command with one ``mmte: error: <what>, <expected>,
<how to fix>`` line on stderr and exit status 2, before anything is written where possible; a run that
fails by itself (a non-finite loss, a full disk) exits 1; SIGINT / SIGTERM exit 130 / 143 after
saving. A log folder created by a failed run is removed unless a checkpoint was saved. ``MMTE_DEBUG=1``
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import re
import shutil
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from .errors import MMTEError, UnknownNameError, UsageError, closest

__all__ = [  # noqa: F822 (MMTECLI: lazy)
    "MMTECLI",
    "convert_main",
    "describe_error",
    "env_main",
    "env_report",
    "export_main",
    "main",
    "modalities_main",
    "modalities_table",
]

logger = logging.getLogger("mmte")

_OVERVIEW = """usage: mmte {fit,validate,test,predict,list,modalities,convert,export,env} ... | mmte --version

Fine-tune Meta-Transformer-style multimodal models from recipe files.

commands:
  fit          train a model: mmte fit --config recipes/quickstart.yaml (stack more --config fragments
               from configs/ to change backbone, freeze policy, precision or parallelism; resume with
               --ckpt_path last)
  validate     evaluate a checkpoint on the validation split (--ckpt_path best | last | <file>)
  test         evaluate a checkpoint on the test split (--ckpt_path)
  predict      write predictions of a checkpoint to CSV/JSON (--ckpt_path, --prediction_writer.output)
  list         what mmte knows by name, one line each: mmte list [modalities|heads|presets|sources|
               strategies|recipes|fragments]
  modalities   the registered modalities as a table (tokenizer, default head, input)
  convert      turn timm / Hugging Face / Meta-Transformer weights into an mmte .safetensors file
  export       write a checkpoint's model as ONNX or a torch.export program, checked against eager
  env          versions (mmte, torch, lightning, timm, onnxruntime), device, CPU flags, threads

`mmte <command> --help` explains a command's options; `--print_config` shows a merged recipe.
Exit status: 0 done, 2 bad input, 1 the run failed, 130/143 stopped by SIGINT/SIGTERM (checkpoint saved).
"""

_LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")

#: ``--model.*`` flags that may differ from a ``--ckpt_path`` checkpoint's hyperparameters: they change
#: where the frozen weights are read from (checked against the checkpoint's fingerprint) or how
#: inference runs, not what was trained. Any other explicit ``--model.*`` flag must agree.
CKPT_OVERRIDABLE = ("backbone_weights", "fuse_for_inference", "predict_dtype", "save_frozen")


_ENTRY_FLAG = re.compile(r"^--model\.(tokenizers|heads)\.([^.=\s]+)\.([^=\s]+)(?:=(.*))?$", re.DOTALL)


def _split_entry_flags(argv: list[str]) -> tuple[list[str], list[tuple[str, str, list[str], str]]]:
    """Take ``--model.heads.<name>.<option> v`` / ``--model.tokenizers.<key>.<option> v`` out of ``argv``.

    The parser treats ``model.heads`` and ``model.tokenizers`` as whole dicts, so such a flag would replace
    the recipe's entry with ``{option: v}`` (dropping its ``name`` and every other option, silently).
    They are applied on top of the parsed recipe instead (:func:`_apply_entry_flags`).
    """
    rest: list[str] = []
    flags: list[tuple[str, str, list[str], str]] = []
    i = 0
    while i < len(argv):
        m = _ENTRY_FLAG.match(argv[i])
        if m is None:
            rest.append(argv[i])
            i += 1
            continue
        section, key, option, value = m.groups()
        if value is None:
            if i + 1 >= len(argv):
                raise UsageError(f"{argv[i]} needs a value", "expected --model.<tokenizers|heads>.<name>.<option> <value>")
            value, i = argv[i + 1], i + 1
        flags.append((section, key, option.split("."), value))
        i += 1
    return rest, flags


def _apply_entry_flags(config: Any, flags: list[tuple[str, str, list[str], str]]) -> list[str]:
    """Set each ``(section, key, option path, YAML value)`` inside the parsed ``model.<section>.<key>``;
    returns the flags that pass the merged sections whole (``--model.heads={...}``)."""
    import json

    import yaml

    sub = config.get("subcommand")
    model = config[sub]["model"] if sub else config["model"]
    for section, key, path, raw in flags:
        entries = dict(model.get(section) or {})
        entry = entries.get(key)
        if entry is None:
            if section == "heads":
                known = ", ".join(entries) or "none"
                raise UsageError(f"--model.heads.{key}.{'.'.join(path)}: the model has no head {key!r}", f"expected one of: {known}")
            entry = {}
        entry = {"name": entry} if isinstance(entry, str) else _plain(entry)
        node = entry
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"--model.{section}.{key}.{'.'.join(path)}: {part!r} is not a mapping", "expected a nested option")
        try:
            node[path[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise UsageError(f"--model.{section}.{key}.{'.'.join(path)}: {raw!r} is not a YAML value ({e.problem})", "expected a number, string, list or mapping") from None
        entries[key] = entry
        model[section] = entries
    return [f"--model.{section}={json.dumps(_plain(model[section]))}" for section in dict.fromkeys(f[0] for f in flags)]


def single_process_checkpoint(ckpt: str | None, root: str) -> str | None:
    """``ckpt`` itself, or, for a distributed checkpoint folder, a portable file consolidated from it
    under ``root`` (what ``mmte convert`` writes), so that one process can load any checkpoint."""
    if not ckpt or not os.path.isdir(str(ckpt)):
        return ckpt
    from .training.portable import consolidate

    out = os.path.join(root, f"{os.path.basename(os.path.normpath(str(ckpt)))}.consolidated.ckpt")
    consolidate(ckpt, out)
    logger.info("consolidated the distributed checkpoint %s into %s for this single-process run", ckpt, out)
    return out


def _warn(msg: str) -> None:
    print(f"mmte: warning: {msg}", file=sys.stderr, flush=True)


def _cli_class():
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

    from .training.callbacks import MMTECheckpoint, PredictionWriter
    from .training.datamodule import MMTEDataModule
    from .training.guards import TrainingGuard
    from .training.module import MMTEModule

    class MMTECLI(LightningCLI):
        """LightningCLI for :class:`MMTEModule` and any :class:`MMTEDataModule` subclass."""

        def __init__(self, args: Any = None, run: bool = True, **kwargs: Any):
            self._argv = [str(a) for a in (sys.argv[1:] if args is None else args)] if not isinstance(args, dict) else []
            # --print_config is answered after mmte's defaults are filled in (before_instantiate_classes), so it
            # shows the logger, callbacks, checkpoint folder and precision a run really uses
            self._print_config = any(a == "--print_config" or a.startswith("--print_config=") for a in self._argv)
            if self._print_config:
                self._argv = [a for a in self._argv if not (a == "--print_config" or a.startswith("--print_config="))]
                if args is None:
                    sys.argv = [sys.argv[0], *self._argv]
                else:
                    args = self._argv
            self._ckpt: dict[str, Any] | None = None  # the --ckpt_path checkpoint, loaded once (mmap)
            kwargs.setdefault("save_config_kwargs", {"overwrite": True})
            kwargs.setdefault("seed_everything_default", 0)
            kwargs.setdefault("trainer_defaults", {"callbacks": [LearningRateMonitor(logging_interval="step"), TrainingGuard()]})
            pk = dict(kwargs.pop("parser_kwargs", None) or {"description": "mmte: fine-tune multimodal models from recipe files", "env_prefix": "MMTE"})
            pk.setdefault("exit_on_error", False)  # errors become one mmte line, not a usage dump
            for sub in _LIGHTNING_COMMANDS:
                pk[sub] = {"exit_on_error": False, **(pk.get(sub) or {})}
            super().__init__(MMTEModule, MMTEDataModule, subclass_mode_data=True, args=args, run=run, auto_configure_optimizers=False,
                             parser_kwargs=pk, **kwargs)

        def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            parser.add_lightning_class_args(MMTECheckpoint, "checkpoint")
            parser.add_lightning_class_args(PredictionWriter, "prediction_writer")
            parser.link_arguments("data.model_info", "model.data_info", apply_on="instantiate")
            parser.add_argument(
                "--precision",
                type=str | None,
                default=None,
                help="auto: bf16-mixed where the CPU (avx512_bf16/AMX) or GPU has native bf16, else 32-true; "
                "any other value is passed to trainer.precision",
            )
            parser.add_argument("--threads", type=int | None, default=None,
                                help="torch intra-op threads (default: $MMTE_THREADS, $OMP_NUM_THREADS, else physical cores // local ranks)")

        def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
            if not isinstance(args, dict):
                rest, entry_flags = _split_entry_flags(self._argv)
                if entry_flags:  # merged into the recipe's entries: parse once without them, then pass whole entries
                    try:
                        first = parser.parse_args([a for a in rest if not a.startswith("--print_config")])
                    except argparse.ArgumentError as e:
                        raise _argparse_usage_error(e, parser, self._argv) from e
                    args = rest + _apply_entry_flags(first, entry_flags)
            try:
                super().parse_arguments(parser, args)
            except argparse.ArgumentError as e:
                raise _argparse_usage_error(e, parser, self._argv) from e

        def _section(self):
            return self.config.get(self.subcommand) if self.subcommand else self.config

        def _ckpt_dir(self, c) -> str:
            root = c.trainer.default_root_dir or os.path.join("runs", "mmte")
            return c.checkpoint.dirpath or os.path.join(root, "checkpoints")

        # ----------------------------------------------------------------------- --ckpt_path
        def _parse_ckpt_path(self) -> None:
            """Resolve ``best``/``last`` to ``<checkpoints>/{best,last}.ckpt`` (in any process), check the file,
            and take the model's hyperparameters from it; an explicit ``--model.*`` flag must agree with
            them unless it is one of :data:`CKPT_OVERRIDABLE`."""
            sub = self.config.get("subcommand")
            if not sub:
                return
            c = self.config[sub]
            path = c.get("ckpt_path")
            if not path:
                return
            folder = self._ckpt_dir(c)
            if path in ("best", "last"):
                f = os.path.join(folder, f"{path}.ckpt")
                if not os.path.exists(f):
                    if sub == "fit" and path == "last":
                        _warn(f"--ckpt_path last: there is no {f} yet, so training starts from scratch")
                        c.ckpt_path = None
                        return
                    raise UsageError(f"--ckpt_path {path}: there is no {f}", f"expected the {path} checkpoint of an earlier mmte fit with this default_root_dir",
                                     "run mmte fit first, or pass --ckpt_path <file>")
                c.ckpt_path = path = f
            self._ckpt = _load_checkpoint(path, folder)
            hparams = dict((self._ckpt or {}).get("hyper_parameters") or {})
            hparams.pop("_instantiator", None)
            if not hparams:
                return
            if "_class_path" in hparams:  # a LightningModule subclass saved by LightningCLI (as Lightning does it)
                hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
                self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)
                return
            given = _explicit_model_flags(self._argv)
            mine = _plain(c.get("model"))
            keep = {}
            for key in given:
                if key not in hparams or key not in mine:
                    continue
                if _plain(mine[key]) == _plain(hparams[key]):
                    continue
                if key in CKPT_OVERRIDABLE:
                    keep[key] = mine[key]
                    continue
                raise UsageError(
                    f"--model.{key} is {_short(mine[key])} but the checkpoint {path} was trained with {_short(hparams[key])}",
                    "expected --model flags that agree with --ckpt_path (the checkpoint defines the model; only "
                    f"{', '.join(CKPT_OVERRIDABLE)} may differ)",
                    f"drop --model.{key}, or train a model with it (mmte fit)",
                )
            self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)
            for key, value in keep.items():
                self.config[sub].model[key] = value

        def before_instantiate_classes(self) -> None:
            from jsonargparse import Namespace

            from .training.allocator import keep_heap
            from .training.threads import set_threads

            c = self._section()
            _resolve_model_entries(c.model)
            set_threads(c.get("threads"), c.trainer.devices, c.trainer.accelerator)
            keep_heap()
            root = c.trainer.default_root_dir or os.path.join("runs", "mmte")
            c.trainer.default_root_dir = root
            _check_trainer_options(c.trainer)
            _check_strategy(c.trainer.get("strategy"))
            _check_writable(root, "--trainer.default_root_dir")
            if c.trainer.logger in (None, True):
                c.trainer.logger = Namespace(class_path="lightning.pytorch.loggers.CSVLogger", init_args=Namespace(save_dir=root, name="logs"))
            elif c.trainer.logger is False:  # nothing to log learning rates to
                self.trainer_defaults = {**self.trainer_defaults, "callbacks": [
                    cb for cb in self.trainer_defaults.get("callbacks", []) if not isinstance(cb, LearningRateMonitor)
                ]}
            if c.checkpoint.dirpath is None:
                c.checkpoint.dirpath = os.path.join(root, "checkpoints")
            # the data state (class map, table schema, scalers) comes from the checkpoint being evaluated
            from .training.datamodule import checkpoint_for_state

            ckpt = checkpoint_for_state(c.get("ckpt_path"), c.checkpoint.dirpath)
            init = c.data.get("init_args") if c.get("data") is not None and hasattr(c.data, "get") else None
            if ckpt and init is not None and "state_from" in init and init.state_from is None:
                init.state_from = ckpt
            _resolve_precision(c, self._argv)
            if self._print_config:
                self._print_effective_config(c)
            if self.subcommand in ("validate", "test", "predict") and not c.get("ckpt_path"):
                _warn_untrained(self.subcommand, c.model)

        def _print_effective_config(self, c) -> None:
            """Print the merged configuration with what mmte adds (logger, callbacks, checkpoint folder, precision)
            and stop, as ``--print_config`` does."""
            from jsonargparse import Namespace

            added = [cb for cb in self.trainer_defaults.get("callbacks", [])]
            shown = [Namespace(class_path=f"{type(cb).__module__}.{type(cb).__qualname__}", init_args=Namespace(_init_args(cb)))
                     for cb in added]
            user = c.trainer.get("callbacks") or []
            c.trainer.callbacks = shown + (list(user) if isinstance(user, list) else [user])
            parser = self.parser._subcommands_action._name_parser_map[self.subcommand] if self.subcommand else self.parser
            print(parser.dump(c, skip_none=False, skip_check=True), end="")
            raise SystemExit(0)

        def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
            # --trainer.enable_checkpointing false: no checkpoint callback (Lightning refuses the pair)
            if config.get("enable_checkpointing") is False:
                from lightning.pytorch.callbacks import ModelCheckpoint

                callbacks = [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)]
            return super()._instantiate_trainer(config, callbacks)

        def _run_subcommand(self, subcommand: str) -> None:
            if self._ckpt is not None:
                _check_checkpoint_fits(self.model, self._ckpt, self.config[subcommand].ckpt_path)
                self._ckpt = None  # release the memory map
            log_dir = self.trainer.log_dir
            root = self.trainer.default_root_dir
            existed = {d: d is not None and os.path.isdir(d) for d in (log_dir, root, os.path.dirname(log_dir or ""))}
            ckpt_dir = self.config_init[subcommand].checkpoint.dirpath if subcommand in self.config_init else None
            before = set(os.listdir(ckpt_dir)) if ckpt_dir and os.path.isdir(ckpt_dir) else set()
            try:
                strategy = self.trainer.strategy
                if callable(getattr(strategy, "preflight", None)):  # refuse what cannot work before any process starts
                    strategy.preflight(self.model, self.trainer.num_nodes * self.trainer.num_devices, subcommand)
                elif subcommand in self.config_init:
                    self._consolidate_folder_checkpoint(subcommand)
                super()._run_subcommand(subcommand)
            except BaseException:
                # nothing half-written: folders this run created go, unless a checkpoint was saved
                saved = ckpt_dir and os.path.isdir(ckpt_dir) and (set(os.listdir(ckpt_dir)) - before)
                if not saved:
                    for d in (log_dir, os.path.dirname(log_dir or ""), root):
                        if d and not existed[d] and os.path.isdir(d):
                            shutil.rmtree(d, ignore_errors=True)
                raise

        def _consolidate_folder_checkpoint(self, subcommand: str) -> None:
            """A distributed checkpoint folder given to a single-process run is consolidated into a portable
            file first (what ``mmte convert`` does), so any checkpoint is usable on one process."""
            ckpt = self.config_init[subcommand].get("ckpt_path")
            self.config_init[subcommand]["ckpt_path"] = single_process_checkpoint(ckpt, self.trainer.default_root_dir)

    return MMTECLI


def __getattr__(name: str):
    if name == "MMTECLI":
        return _cli_class()
    raise AttributeError(name)


def _init_args(obj: Any) -> dict[str, Any]:
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


def _resolve_model_entries(model: Any) -> None:
    """Tokenizer and head entries given by ``class_path`` (jsonargparse parses them into Namespaces) become
    plain dicts again, and every class path or registry name among them is resolved now: importing a user's
    module (on PYTHONPATH) registers its modalities and heads before the data module looks them up."""
    from .heads import get_head
    from .registry import entry_from_class_path
    from .tokenizers.registry import get_modality

    if model is None or not hasattr(model, "get"):
        return
    for section, resolve in (("tokenizers", get_modality), ("heads", get_head)):
        entries = model.get(section)
        if not entries:
            continue
        plain = {k: _plain(v) for k, v in _plain(entries).items()}
        for entry in plain.values():
            init = entry.get("init_args") if isinstance(entry, dict) else None
            if isinstance(init, dict) and "dim" in init and init["dim"] is None:
                del init["dim"]  # jsonargparse lists the constructor's width; the backbone sets it
            name = entry if isinstance(entry, str) else entry_from_class_path(entry).get("name") if isinstance(entry, Mapping) else None
            if isinstance(name, str) and ("." in name or ":" in name):
                resolve(name)
        model[section] = plain


def _resolve_precision(c: Any, argv: list[str] = ()) -> None:
    """Map the top-level ``precision`` (``auto`` or a Lightning value) onto ``trainer.precision`` and log
    the run header: CPU, the flags that matter, threads, and the precision chosen (and why).

    An explicit ``--trainer.precision`` on the command line wins over a recipe's ``precision`` (both on
    the command line with different values is an error)."""
    from . import device as mdev

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
    accel = str(c.trainer.accelerator or "auto")
    dev = "cpu" if accel == "cpu" or not any(mdev.is_available(t) for t in ("cuda", "musa")) else mdev.default_device().type
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


# --------------------------------------------------------------------------------- checks
def _plain(v: Any) -> Any:
    """A jsonargparse Namespace / tuple -> plain dicts and lists, for comparisons."""
    if hasattr(v, "as_dict"):
        v = v.as_dict()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _short(v: Any, n: int = 80) -> str:
    s = repr(_plain(v))
    return s if len(s) <= n else s[: n - 3] + "..."


def _explicit_model_flags(argv: list[str]) -> list[str]:
    """Top-level ``model`` keys given as command-line flags (``--model.lr 0.1``, ``--model.heads={...}``)."""
    keys = []
    for a in argv:
        if a.startswith("--model.") and len(a) > len("--model."):
            keys.append(a[len("--model.") :].split("=", 1)[0].split(".", 1)[0])
    return list(dict.fromkeys(keys))


def _load_checkpoint(path: str, folder: str) -> dict[str, Any] | None:
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


def _check_checkpoint_fits(module: Any, ckpt: dict[str, Any], path: str) -> None:
    """Compare the checkpoint's tensor shapes with the model's (built on the meta device): a head trained
    for another number of classes fails here, naming the tensor, not in ``load_state_dict``."""
    sd = ckpt.get("state_dict") or {}
    if not sd or not hasattr(module, "_build"):
        return
    from .training.module import quiet_model_logs

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


def _check_trainer_options(t: Any) -> None:
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
        from . import device as mdevice

        here = [t for t in mdevice.available_types() if t != "cpu"]
        if (name == "gpu" and not here) or (name != "gpu" and name not in here):
            raise UsageError(f"--trainer.accelerator is {name!r} but this machine has no such device (found: {', '.join(here) or 'CPU only'})",
                             "expected an accelerator that is present", "set --trainer.accelerator auto (or cpu)")


def _check_strategy(strategy: Any) -> None:
    """A strategy given by name must be one Lightning knows (its own message is a paragraph)."""
    if not isinstance(strategy, str) or strategy == "auto":
        return
    from lightning.pytorch.strategies import StrategyRegistry

    from .training import strategy as _registers_mmte_strategies  # noqa: F401 - mmte, mmte_tp2, ... are registered on import

    known = ["auto", *StrategyRegistry.available_strategies()]
    if strategy not in known:
        raise UnknownNameError("strategy", strategy, known, "or stack a configs/parallel/*.yaml fragment (e.g. ddp.yaml, tp2.yaml)")


def _check_writable(root: str, flag: str) -> None:
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


def _warn_untrained(command: str, model: Any) -> None:
    m = _plain(model) or {}
    heads = ", ".join(sorted((m.get("heads") or {}).keys())) or "the heads"
    src = m.get("backbone_weights")
    backbone = (f"only the backbone has pretrained weights ({src}); " if src else "the backbone too has no pretrained weights; ")
    _warn(f"{command} without --ckpt_path: the heads ({heads}) and tokenizers are randomly initialised ({backbone}the output is "
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


def _argparse_usage_error(e: argparse.ArgumentError, parser: Any, argv: list[str]) -> UsageError:
    """jsonargparse's parse errors -> one mmte line (unknown options get the closest known one)."""
    msg = " ".join(str(e.message if hasattr(e, "message") else e).split())
    sub = argv[0] if argv and argv[0] in _LIGHTNING_COMMANDS else None
    if "unrecognized arguments:" in msg:
        bad = [a for a in msg.split("unrecognized arguments:", 1)[1].split() if a.startswith("-")]
        flag = bad[0].split("=", 1)[0] if bad else msg
        hit = closest(flag, _option_strings(parser, sub))
        return UsageError(f"unknown option {flag}", f"expected an option listed by mmte {sub + ' ' if sub else ''}--help"
                          + (f" (did you mean {hit[0]}?)" if hit else ""), "fix the spelling or drop it")
    key = None
    if msg.startswith('Parser key "'):
        key, _, msg = msg[len('Parser key "') :].partition('":')
    what = f"--{key} has a value mmte cannot use: {msg.strip()}" if key else msg
    if len(what) > 400:
        what = what[:397] + "..."
    return UsageError(what, "expected a value of the type the option's help shows", f"see mmte {sub} --help" if sub else "see mmte --help")


def _option_strings(parser: Any, sub: str | None) -> list[str]:
    p = parser
    if sub:
        try:
            p = parser._subcommands_action._name_parser_map[sub]
        except (AttributeError, KeyError):
            p = parser
    out = []
    for a in getattr(p, "_actions", []):
        out += [o for o in a.option_strings if o.startswith("--")]
    return sorted(set(out))


# ---------------------------------------------------------------------------- error lines
def describe_error(e: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit status)`` for an error the user should see as one line, else None
    (a bug: the traceback is more useful)."""
    if isinstance(e, MMTEError):
        return str(e), e.exit_code
    union = _union_reason(e)
    if union:
        return union, 2
    inner = _innermost(e)
    if inner is not e and isinstance(inner, MMTEError):
        return str(inner), inner.exit_code
    name = type(inner).__name__
    text = " ".join(str(inner.args[0] if isinstance(inner, KeyError) and inner.args else inner).split())
    if name == "MisconfigurationException" or isinstance(inner, (ValueError, TypeError, KeyError, FileNotFoundError, NotADirectoryError,
                                                                  IsADirectoryError, ImportError, argparse.ArgumentError)):
        return text or name, 2
    if name == "SafetensorError":
        return f"a .safetensors file is malformed ({text}), expected a file written by safetensors (e.g. mmte convert), replace the file", 2
    if isinstance(inner, OSError):
        return f"{text or name}, expected a readable input and writable output, check the path, permissions and free disk space", 1
    if isinstance(inner, RuntimeError) and "Error(s) in loading state_dict" in text:
        return f"{text[:400]}, expected a checkpoint of this model, use the recipe the checkpoint was trained with", 2
    return None


def _union_reason(e: BaseException) -> str | None:
    """jsonargparse reports a failed constructor of a ``Union`` option (e.g. ``trainer.strategy``) as a list
    of per-type errors; the one that is not a bare type mismatch is the user's mistake."""
    seen: BaseException | None = e
    while seen is not None:
        text = str(seen)
        if "Errors:" in text:
            for ln in text.split("Errors:", 1)[1].splitlines():
                ln = ln.strip()
                if ln.startswith("- ") and not ln[2:].startswith(("Expected a <class", "Not a valid subclass", "Does not validate")):
                    return " ".join(ln[2:].split())
        seen = seen.__cause__ or (seen.__context__ if not seen.__suppress_context__ else None)
    return None


def _innermost(e: BaseException) -> BaseException:
    """The deepest cause in the chain that is an mmte error (jsonargparse wraps errors raised in
    constructors), else the deepest cause."""
    seen, chain = e, [e]
    while (seen.__cause__ is not None or (seen.__context__ is not None and not seen.__suppress_context__)) and len(chain) < 32:
        seen = seen.__cause__ or seen.__context__
        chain.append(seen)
    for c in reversed(chain):
        if isinstance(c, MMTEError):
            return c
    # prefer the deepest error raised by mmte code (not a wrapper jsonargparse built around it)
    for c in reversed(chain):
        tb = c.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None and f"{os.sep}mmte{os.sep}" in tb.tb_frame.f_code.co_filename:
            return c
    return chain[-1]


# ------------------------------------------------------------------------------------ modalities
def modalities_table() -> str:
    """A plain-text table of the registered modalities: tokenizer, default head, variable length, input."""
    from .tokenizers.registry import get_modality, list_modalities

    rows = [("modality", "tokenizer", "default head", "var.len", "input")]
    for name in list_modalities():
        s = get_modality(name)
        head = s.default_head.get("name", "?")
        extra = ", ".join(f"{k}={v}" for k, v in s.default_head.items() if k != "name")
        rows.append((name, s.tokenizer.__name__, head + (f" ({extra})" if extra else ""), "yes" if s.variable_length else "no", s.description))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
        if j == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 5)
    return "\n".join(lines)


#: ``mmte list`` sections, in the order ``mmte list`` prints them
LIST_SECTIONS = ("modalities", "heads", "presets", "sources", "strategies", "recipes", "fragments")


def _first_sentence(text: str, limit: int = 120) -> str:
    """The first sentence of a docstring or YAML header (one line, at most ``limit`` characters)."""
    one = " ".join(text.split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", one)
    one = one[: m.start()] if m else one.rstrip(".")
    return one if len(one) <= limit else one[: limit - 3].rstrip() + "..."


def _yaml_header(path: str) -> str:
    """A YAML file's leading comment paragraph (its description)."""
    lines = []
    with open(path, encoding="utf-8") as fh:
        for ln in fh:
            if not ln.startswith("#"):
                break
            text = ln[1:].strip()
            if not text:
                if lines:
                    break
                continue
            lines.append(text)
    return " ".join(lines)


def _doc(obj: Any) -> str:
    import inspect

    return inspect.getdoc(obj) or ""


def _project_dir(name: str) -> str | None:
    """``recipes`` / ``configs``: the folder under the current directory, else the one beside the mmte package
    (an editable install of the repository)."""
    here = os.path.join(os.getcwd(), name)
    if os.path.isdir(here):
        return here
    beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name)
    return beside if os.path.isdir(beside) else None


def _rel(path: str) -> str:
    r = os.path.relpath(path)
    return path if r.startswith("..") else r


def list_entries(section: str) -> list[tuple[str, str]]:
    """``(name, one-line description)`` rows of an ``mmte list`` section (see :data:`LIST_SECTIONS`)."""
    if section == "modalities":
        from .tokenizers.registry import MODALITIES

        return [(n, f"{s.tokenizer.__name__}, default head {s.default_head.get('name')}: {(s.description or _first_sentence(_doc(s.tokenizer))).rstrip('.')}")
                for n, s in MODALITIES.items()]
    if section == "heads":
        from .heads import HEADS

        return [(n, f"{c.__name__} ({getattr(c, 'task', None) or 'no task'}): {_first_sentence(_doc(c))}") for n, c in HEADS.items()]
    if section == "presets":
        from .encoders.presets import PRESETS

        return [(n, f"{c.num_layers} layers x {c.hidden_size}, {c.num_attention_heads} attention heads, MLP {c.ffn_hidden_size}")
                for n, c in sorted(PRESETS.items())]
    if section == "sources":
        from .encoders.sources import BACKBONE_SOURCES

        rows = [(n, desc) for n, (desc, _) in sorted(BACKBONE_SOURCES.items())]
        return rows + [("timm:<name>", "a timm ViT from the Hugging Face cache, e.g. timm:vit_base_patch16_clip_224.openai"),
                       ("hf:<org>/<name>", "a Hugging Face BERT / ViT / CLIP vision model from the cache, or hf:<local folder>"),
                       ("open_clip:<arch>/<tag>", "an OpenCLIP vision tower (pip install 'mmte[open_clip]')"),
                       ("<file>.safetensors", "an mmte convert output (it carries the backbone's shape)"),
                       ("<file>.pth", "the Meta-Transformer release's encoder weights")]
    if section == "strategies":
        from lightning.pytorch.strategies import StrategyRegistry

        from .training.strategy import PRESETS

        rows = [(n, "mmte DP x TP x PP: " + (", ".join(f"{k}={v}" for k, v in kw.items()) or "FSDP2 over all ranks"))
                for n, kw in PRESETS.items()]
        return rows + [(n, f"Lightning: {StrategyRegistry[n].get('description', '')}") for n in StrategyRegistry.available_strategies()
                       if n not in PRESETS]
    if section in ("recipes", "fragments"):
        root = _project_dir("recipes" if section == "recipes" else "configs")
        if root is None:
            return []
        files = sorted(glob.glob(os.path.join(root, "*.yaml"))) if section == "recipes" else sorted(glob.glob(os.path.join(root, "*", "*.yaml")))
        return [(_rel(f), _first_sentence(_yaml_header(f))) for f in files]
    raise UnknownNameError("mmte list section", section, LIST_SECTIONS, "see mmte list --help")


def list_main(argv: list[str]) -> int:
    """``mmte list [section ...]``: registered and shipped names, one line each."""
    p = argparse.ArgumentParser(prog="mmte list", description="List what mmte can use by name, one line each: "
                                + ", ".join(LIST_SECTIONS) + " (default: all of them).")
    p.add_argument("sections", nargs="*", metavar="section", help="one or more of: " + ", ".join(LIST_SECTIONS))
    a = p.parse_args(argv)
    for s in a.sections:
        if s not in LIST_SECTIONS:
            raise UnknownNameError("mmte list section", s, LIST_SECTIONS, "see mmte list --help")
    sections = a.sections or list(LIST_SECTIONS)
    for i, s in enumerate(sections):
        rows = list_entries(s)
        if len(sections) > 1:
            print(("\n" if i else "") + f"{s}:")
        w = max((len(n) for n, _ in rows), default=0)
        indent = "  " if len(sections) > 1 else ""
        print("\n".join(f"{indent}{n.ljust(w)}  {d}" for n, d in rows))
    return 0


def modalities_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mmte modalities", description="List the registered modalities (built-ins and mmte.modalities plug-ins).")
    p.parse_args(argv)
    print(modalities_table())
    return 0


# --------------------------------------------------------------------------------------- convert
def convert_main(argv: list[str]) -> int:
    """``mmte convert``: pretrained weights -> an mmte backbone ``.safetensors`` usable as ``backbone_weights``."""
    p = argparse.ArgumentParser(
        prog="mmte convert",
        description=(
            "Convert pretrained transformer weights into an mmte backbone file (safetensors, mmte key names, the "
            "BackboneConfig in the metadata). Use it in a recipe as model.backbone_weights: <file>."
        ),
    )
    p.add_argument("--from", dest="kind", choices=["hf", "timm", "meta-transformer", "named", "dcp"],
                   help="hf: a local Hugging Face BERT/ViT/CLIP-vision folder; timm: a timm model name (with --checkpoint); "
                        "meta-transformer: the release's .pth; named: a named source such as minilm-l6; dcp: a distributed "
                        "checkpoint folder (save_distributed_checkpoint: true) -> one portable .ckpt (inferred for such a folder)")
    p.add_argument("source", help="folder, model name, file or named source")
    p.add_argument("out_path", nargs="?", help="output file (same as --out)")
    p.add_argument("--out", help="output path: .safetensors (backbone weights) or .ckpt (--from dcp)")
    p.add_argument("--checkpoint", help="timm: local weights file for the model (nothing is downloaded)")
    p.add_argument("--preset", default="meta-transformer-b16", help="meta-transformer: the backbone shape (default %(default)s)")
    a = p.parse_args(argv)
    a.out = a.out or a.out_path
    if a.kind is None and os.path.isfile(os.path.join(a.source, ".metadata")):
        a.kind = "dcp"
    if a.kind is None or a.out is None:
        raise UsageError(f"mmte convert {' '.join(argv)} lacks {'--from' if a.kind is None else 'an output path'}",
                         "expected --from {hf,timm,meta-transformer,named,dcp} and an output path (--out FILE)", "see mmte convert --help")
    if a.kind == "dcp":
        if not a.out.endswith(".ckpt"):
            raise UsageError(f"--out must end in .ckpt for a distributed checkpoint; got {a.out!r}", "expected a .ckpt path",
                             f"use --out {os.path.splitext(a.out)[0]}.ckpt")
        from .training.portable import consolidate

        ckpt = consolidate(a.source, a.out)
        print(f"wrote {a.out}: {len(ckpt['state_dict'])} tensors from the distributed checkpoint {a.source} (usable by one process or any layout)")
        return 0
    if not a.out.endswith(".safetensors"):
        raise UsageError(f"--out must end in .safetensors; got {a.out!r}", "expected a .safetensors path", f"use --out {os.path.splitext(a.out)[0]}.safetensors")
    import dataclasses
    import json

    from safetensors.torch import save_file

    from .encoders import from_hf, from_timm, load_meta_transformer

    if a.kind == "hf":
        from .training.module import resolve_backbone_source

        backbone = resolve_backbone_source("hf:" + a.source)
    elif a.kind == "named":
        from .training.module import BACKBONE_SOURCES, resolve_backbone_source

        if a.source.lower() not in BACKBONE_SOURCES:
            raise UnknownNameError("named source", a.source, BACKBONE_SOURCES, "see mmte convert --help")
        backbone = resolve_backbone_source(a.source)
    elif a.kind == "timm":
        import timm

        if a.checkpoint and not os.path.isfile(a.checkpoint):
            raise UsageError(f"--checkpoint {a.checkpoint} does not exist", "expected a local weights file for the timm model", "check the path")
        if not a.checkpoint:
            _warn(f"--from timm without --checkpoint writes timm's RANDOM initialisation of {a.source} (mmte downloads nothing); "
                  "pass --checkpoint <weights file> for pretrained weights")
        if a.source not in timm.list_models():
            raise UnknownNameError("timm model", a.source, timm.list_models(), "see timm.list_models()")
        model = timm.create_model(a.source, pretrained=False, checkpoint_path=a.checkpoint or "")
        backbone = from_timm(model).backbone
    else:
        backbone = load_meta_transformer(a.source, a.preset)
    del from_hf
    sd = {k: v.contiguous() for k, v in backbone.state_dict().items()}
    meta = {"format": "mmte-backbone", "config": json.dumps(dataclasses.asdict(backbone.config)), "source": f"{a.kind}:{a.source}"}
    from .training.callbacks import atomic_write_with

    atomic_write_with(a.out, lambda tmp: save_file(sd, tmp, metadata=meta))
    n = sum(v.numel() for v in sd.values())
    print(f"wrote {a.out}: {len(sd)} tensors, {n:,} parameters, {backbone.config.num_layers}x{backbone.config.hidden_size} ({a.kind}:{a.source})")
    return 0


# ------------------------------------------------------------------------------------------- env
def env_report() -> list[tuple[str, str]]:
    """``(name, value)`` rows: package versions, device, CPU model/capability/flags, cores, threads,
    the precision ``auto`` picks here."""
    import importlib.metadata as md

    import torch

    from . import __version__
    from . import device as mdev

    rows = [("mmte", __version__), ("torch", torch.__version__)]
    for pkg in ("lightning", "timm", "transformers", "onnx", "onnxruntime", "onnxscript"):
        try:
            rows.append((pkg, md.version(pkg)))
        except md.PackageNotFoundError:
            rows.append((pkg, "not installed"))
    c = mdev.cpu_info()
    dev = mdev.default_device().type
    rows += [
        ("python", sys.version.split()[0]),
        ("device", dev if dev == "cpu" else f"{dev} ({mdev.info(dev).name})"),
        ("cpu", c.model),
        ("cpu capability", f"{c.capability} (best matrix ISA: {c.isa})"),
        ("cpu flags", ", ".join(c.flags) or "none of note"),
        ("cores", f"{c.physical_cores} physical, {c.logical_cores} logical (this process's affinity)"),
        ("torch threads", str(torch.get_num_threads())),
        ("cpu allocator", _allocator_row()),
        ("precision auto", "{} ({})".format(*mdev.choose_precision(dev))),
        ("inference prepack", _prepack_row()),
        ("inference small rows", _small_rows_row()),
    ]
    return rows


def _allocator_row() -> str:
    """What ``mmte fit/predict`` do to glibc's allocator here (:mod:`mmte.training.allocator`)."""
    from .training.allocator import heap_plan

    why = heap_plan()
    return f"left as is ({why})" if why else "mmte runs keep large blocks in glibc's heap (MMTE_MALLOC=0 turns off)"


def _prepack_row() -> str:
    """Which CPU GEMM weights ``mmte predict`` / ``model.inference()`` prepack here (:mod:`mmte.te.prepack`)."""
    import torch

    from .te.prepack import available

    kinds = [n for n, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)) if available(dt)]
    return f"{' and '.join(kinds)} GEMM weights (oneDNN blocked layout)" if kinds else "unavailable (no oneDNN in this torch build)"


def _small_rows_row() -> str:
    """Whether a bf16 inference copy runs inputs of a few rows in fp32 on fp16-packed weights here."""
    import torch

    from .te.prepack import SMALL_ROWS, available, small_available

    if not available(torch.bfloat16):
        return "off (no bf16 inference prepacking on this CPU)"
    if not small_available():
        return "off (this torch build has no fbgemm fp16-weight GEMM)"
    return f"<= {SMALL_ROWS} rows (batch x tokens) in fp32 on fp16-packed weights (fbgemm)"


def env_main(argv: list[str]) -> int:
    """``mmte env``: print the environment report (``--json`` for a JSON object)."""
    p = argparse.ArgumentParser(prog="mmte env", description="Versions, device, CPU flags and threads, for bug reports and benchmark tables.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    rows = env_report()
    if a.json:
        import json

        print(json.dumps(dict(rows)))
    else:
        w = max(len(k) for k, _ in rows)
        print("\n".join(f"{k.ljust(w)}  {v}" for k, v in rows))
    return 0


def export_main(argv: list[str]) -> int:
    """``mmte export``: see :func:`mmte.export.export_main`."""
    from .export import export_main as run

    return run(argv, _cli_class())


#: extra (non-Lightning) subcommands: name -> main(argv) -> exit status
COMMANDS = {"list": list_main, "modalities": modalities_main, "convert": convert_main, "env": env_main, "export": export_main}


# ------------------------------------------------------------------------------------------ main
class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (a handler bound to the stderr of its creation breaks when a
    caller, e.g. a test harness, swaps and closes it between commands)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _setup_logging() -> None:
    mlog = logging.getLogger("mmte")
    # one line per transformation applied (DESIGN.md house style); a handler someone else attached
    # (a test capturing the lines, an application's own) does not replace ours
    if not any(isinstance(h, _StderrHandler) for h in mlog.handlers):
        h = _StderrHandler()
        h.setFormatter(logging.Formatter("mmte: %(message)s"))
        mlog.addHandler(h)
        mlog.propagate = False
    if mlog.level == logging.NOTSET:
        mlog.setLevel(logging.INFO)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)  # "Seed set to 0" on every command
    _quiet_library_noise()


#: Library messages a user of ``mmte`` can do nothing about: (category, message regex, module regex). Each is
#: hidden by an exact filter, so any other warning of the same libraries still shows.
_NOISE_WARNINGS = (
    # lightning 2.6 calls torch's deprecated isinstance(spec, LeafSpec) on every step
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
    # the model summary's size estimate under bf16-mixed (mmte's precision: auto picks it)
    (UserWarning, r"Precision \S+ is not supported by the model summary", r"lightning\.pytorch\.utilities\.model_summary"),
    # epoch-level logs under data parallelism: mmte logs rank-local training losses (evaluation losses are averaged over ranks)
    (None, r"It is recommended to use `self\.log\('(train|val|test)_", r"lightning\.pytorch\.trainer\.connectors\.logger_connector\.result"),
)
#: (logger, message prefix) of library log records hidden the same way.
_NOISE_LOGS = (
    # torchao registers its Enums as pytree constants at import; torch 2.14 deprecates that (torchao's business)
    ("torch.utils._pytree", "<enum "),
    # Lightning's advertisement for its cloud logger
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud logging"),
)


class _DropMessages(logging.Filter):
    def __init__(self, prefix: str, contains: str = ""):
        super().__init__()
        self.prefix, self.contains = prefix, contains

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith(self.prefix) and self.contains in msg)


def _quiet_library_noise() -> None:
    """Install the filters of :data:`_NOISE_WARNINGS` and :data:`_NOISE_LOGS` (once)."""
    for category, message, module in _NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category or Warning, module=module)
    for name, prefix in _NOISE_LOGS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) and f.prefix == prefix for f in log.filters):
            contains = "is an Enum subclass and is now natively supported" if name == "torch.utils._pytree" else ""
            log.addFilter(_DropMessages(prefix, contains))


def _exit_now(code: int) -> None:
    """End the process with ``code`` without the interpreter's teardown.

    Tearing down the modules that Lightning pulls in (torch, torchmetrics, torchvision, sympy, ...)
    takes 1.2-1.6 s on two cores, a twentieth of the quickstart. Everything a normal exit does that
    matters is done first: other non-daemon threads are joined, ``atexit`` handlers run (DataLoader
    workers, torch.distributed, temporary files), logging handlers and the standard streams are flushed
    and closed. Files are written by mmte and Lightning's loggers inside ``with`` blocks or closed at
    the end of the run. ``MMTE_FAST_EXIT=0`` keeps the ordinary exit.
    """
    import atexit
    import threading

    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or a vanished pipe: nothing left to write
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mmte`` console script and ``python -m mmte``; returns the exit status
    (as the console script, the process ends there: see :func:`_exit_now`)."""
    from_sys = argv is None
    code = _main(argv)
    if from_sys and os.environ.get("MMTE_FAST_EXIT", "1") != "0":
        _exit_now(code)
    return code


def _main(argv: list[str] | None) -> int:
    from ._signals import install_cli_signal_handlers
    from .errors import Interrupted

    from_sys = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("MMTE_DEBUG", "") not in ("", "0")
    _setup_logging()
    if not argv or argv[0] in ("-h", "--help"):
        print(_OVERVIEW)
        return 0
    if argv[0] in ("--version", "-V"):
        from . import __version__

        print(f"mmte {__version__}")
        return 0
    restore = install_cli_signal_handlers()
    try:
        if argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        if argv[0] not in _LIGHTNING_COMMANDS and not argv[0].startswith("-"):
            raise UnknownNameError("command", argv[0], [*_LIGHTNING_COMMANDS, *COMMANDS], "see mmte --help")
        check_config_files(argv)
        _cli_class()(args=None if from_sys else argv)
        from ._signals import pending_signal

        sig = pending_signal()
        if sig is not None:  # arrived after the last step boundary: the final checkpoint is written
            raise Interrupted(sig)
        return 0
    except Interrupted as e:
        print(f"mmte: {e}", file=sys.stderr, flush=True)
        return e.code
    except BrokenPipeError:  # `mmte list | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SystemExit as e:  # --help, --print_config, argparse in modalities/convert
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except BaseException as e:
        if debug:
            raise
        d = describe_error(e)
        if d is None:
            raise
        print(f"mmte: error: {d[0]}", file=sys.stderr, flush=True)
        return d[1]
    finally:
        restore()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
