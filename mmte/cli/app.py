""":class:`MMTECLI`: Lightning's CLI for :class:`~mmte.training.module.MMTEModule` and any
:class:`~mmte.training.data.MMTEDataModule`, with mmte's defaults and checks.

Defaults the recipes build on: a progress bar, a CSV logger in ``<default_root_dir>/logs/version_N``
(config.yaml beside it; every logger also gets the merged recipe and the best checkpoint's
path: :mod:`mmte.cli._tracking`), :class:`~mmte.training.callbacks.MMTECheckpoint` writing
``<default_root_dir>/checkpoints/last.ckpt`` and ``best.ckpt``, a learning-rate monitor, the
:class:`~mmte.training.guards.TrainingGuard` (a non-finite loss stops the run; SIGINT/SIGTERM save
``last.ckpt`` at the next step boundary and stop), and the data's ``model_info`` (classes, channels,
horizon...) linked into ``model.data_info``. ``--ckpt_path`` is handled by :mod:`mmte.cli.checkpoint`.
A log folder created by a failed run is removed unless a checkpoint was saved.

This module imports Lightning; :mod:`mmte.cli` loads it only for the verbs that need it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from ..errors import UsageError
from ..training.callbacks import MMTECheckpoint, PredictionWriter
from ..training.data import MMTEDataModule
from ..training.guards import TrainingGuard
from ..training.module import MMTEModule
from ._tracking import TrackedConfig
from .checkpoint import (
    apply_checkpoint_hparams,
    check_checkpoint_fits,
    checkpoint_dir,
    load_checkpoint,
    resolve_ckpt_path,
    single_process_checkpoint,
)
from .checks import (
    LIGHTNING_COMMANDS,
    check_strategy,
    check_trainer_options,
    check_writable,
    init_args,
    resolve_model_entries,
    resolve_precision,
    resolve_predict_dtype,
    warn_untrained,
)
from .errors import argparse_usage_error

__all__ = ["MMTECLI"]


class MMTECLI(LightningCLI):
    """LightningCLI for :class:`MMTEModule` and any :class:`MMTEDataModule` subclass.

    Args:
        args: the command line (default ``sys.argv[1:]``) or a dict config.
        run: run the subcommand (``fit``...) or only build the model, data and trainer.
        parse_only: stop after parsing (``self.config`` holds the merged recipe; nothing is built,
            nothing is checked or written): how ``mmte export`` finds a recipe's checkpoint folder.
        **kwargs: passed to :class:`~lightning.pytorch.cli.LightningCLI`.
    """

    def __init__(self, args: Any = None, run: bool = True, parse_only: bool = False, **kwargs: Any):
        self._argv = [str(a) for a in (sys.argv[1:] if args is None else args)] if not isinstance(args, dict) else []
        self._parse_only = parse_only
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
        # the heads and modalities the recipe names by class path are imported before the parser types the entries
        self._entry_keys = prepare_entry_types(args if isinstance(args, dict) else self._argv)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("save_config_callback", TrackedConfig)  # config.yaml, and the merged recipe to every logger
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("trainer_defaults", {"callbacks": [LearningRateMonitor(logging_interval="step"), TrainingGuard()]})
        pk = dict(kwargs.pop("parser_kwargs", None) or {"description": "mmte: fine-tune multimodal models from recipe files", "env_prefix": "MMTE"})
        pk.setdefault("exit_on_error", False)  # errors become one mmte line, not a usage dump
        for sub in LIGHTNING_COMMANDS:
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
            check_entry_flags(self._argv, self._entry_keys)
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as e:
            raise argparse_usage_error(e, parser, self._argv) from e

    def _section(self):
        return self.config.get(self.subcommand) if self.subcommand else self.config

    def _parse_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path`` (:func:`~mmte.cli.checkpoint.resolve_ckpt_path`), open the file once and take
        the model's hyperparameters from it (:func:`~mmte.cli.checkpoint.apply_checkpoint_hparams`)."""
        sub = self.config.get("subcommand")
        if not sub or self._parse_only:
            return
        c = self.config[sub]
        if not c.get("ckpt_path"):
            return
        folder = checkpoint_dir(c)
        path = c.ckpt_path = resolve_ckpt_path(c.ckpt_path, folder, sub)
        if path is None:
            return
        self._ckpt = load_checkpoint(path, folder)
        self.config = apply_checkpoint_hparams(self.parser, self.config, sub, self._ckpt, path, self._argv)

    def before_instantiate_classes(self) -> None:
        if self._parse_only:
            return
        from jsonargparse import Namespace

        from ..training.data import checkpoint_for_state
        from ..training.threads import set_threads

        c = self._section()
        resolve_model_entries(c.model)
        drop_unset_options(c.model)
        set_threads(c.get("threads"), c.trainer.devices, c.trainer.accelerator)
        root = c.trainer.default_root_dir or os.path.join("runs", "mmte")
        c.trainer.default_root_dir = root
        check_trainer_options(c.trainer)
        check_strategy(c.trainer.get("strategy"))
        check_writable(root, "--trainer.default_root_dir")
        if c.trainer.logger in (None, True):
            c.trainer.logger = Namespace(class_path="lightning.pytorch.loggers.CSVLogger", init_args=Namespace(save_dir=root, name="logs"))
        elif c.trainer.logger is False:  # nothing to log learning rates to
            self.trainer_defaults = {**self.trainer_defaults, "callbacks": [
                cb for cb in self.trainer_defaults.get("callbacks", []) if not isinstance(cb, LearningRateMonitor)
            ]}
        if c.checkpoint.dirpath is None:
            c.checkpoint.dirpath = os.path.join(root, "checkpoints")
        # the data state (class map, table schema, scalers) comes from the checkpoint being evaluated
        ckpt = checkpoint_for_state(c.get("ckpt_path"), c.checkpoint.dirpath)
        init = c.data.get("init_args") if c.get("data") is not None and hasattr(c.data, "get") else None
        if ckpt and init is not None and "state_from" in init and init.state_from is None:
            init.state_from = ckpt
        resolve_precision(c, self._argv)
        resolve_predict_dtype(c, self._argv, self.subcommand)
        if self._print_config:
            self._print_effective_config(c)
        if self.subcommand in ("validate", "test", "predict") and not c.get("ckpt_path"):
            warn_untrained(self.subcommand, c.model)

    def instantiate_classes(self) -> None:
        if not self._parse_only:
            super().instantiate_classes()

    def _print_effective_config(self, c) -> None:
        """Print the merged configuration with what mmte adds (logger, callbacks, checkpoint folder, precision)
        and stop, as ``--print_config`` does."""
        from jsonargparse import Namespace

        added = [cb for cb in self.trainer_defaults.get("callbacks", [])]
        shown = [Namespace(class_path=f"{type(cb).__module__}.{type(cb).__qualname__}", init_args=Namespace(init_args(cb)))
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
            check_checkpoint_fits(self.model, self._ckpt, self.config[subcommand].ckpt_path)
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


# ------------------------------------------------------------------------- typed model entries
def _recipe_models(args: list[str] | dict[str, Any]) -> list[Any]:
    """The ``model`` sections a command line gives as whole values: its ``--config`` files (top level or under
    the verb) and ``--model`` / ``--model.heads`` / ``--model.tokenizers`` values; a dict config's own."""
    import yaml

    if isinstance(args, dict):
        return [args.get("model"), *(v.get("model") for v in args.values() if isinstance(v, dict))]
    out: list[Any] = []
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        try:
            if flag == "--config":
                with open(value) as fh:
                    doc = yaml.safe_load(fh)
                if isinstance(doc, dict):
                    out += [doc.get("model"), *(v.get("model") for k, v in doc.items() if k in LIGHTNING_COMMANDS and isinstance(v, dict))]
            elif flag == "--model":
                out.append(yaml.safe_load(value))
            elif flag in ("--model.heads", "--model.tokenizers"):
                out.append({flag.rsplit(".", 1)[1]: yaml.safe_load(value)})
        except (OSError, yaml.YAMLError):
            continue  # the parser reports it
    return out


def prepare_entry_types(args: list[str] | dict[str, Any]) -> dict[str, set[str]]:
    """Import the heads and modalities the recipe names by class path (``name: examples.ecg.AttentionPoolHead``)
    and rebuild the parser's entry types (:func:`mmte.config.refresh_entry_types`) from the registries.

    Returns:
        ``{"heads": keys, "tokenizers": keys}``: the entries the recipe defines.

    Raises:
        UsageError: an entry spelt ``{class_path: ..., init_args: ...}`` (the spelling is ``name: <class path>``
            with the options beside it).
    """
    from ..config import check_entry_strings, refresh_entry_types
    from ..heads import get_head
    from ..tokenizers.registry import get_modality

    keys: dict[str, set[str]] = {"heads": set(), "tokenizers": set()}
    for model in _recipe_models(args):
        if not isinstance(model, dict):
            continue
        for section, resolve in (("tokenizers", get_modality), ("heads", get_head)):
            entries = model.get(section)
            if not isinstance(entries, dict):
                continue
            for key, entry in entries.items():
                keys[section].add(key)
                if isinstance(entry, dict) and "class_path" in entry:
                    opts = ", ".join(f"{k}: {v}" for k, v in (entry.get("init_args") or {}).items())
                    raise UsageError(f"model.{section}.{key} is spelt {{class_path: {entry['class_path']}, init_args: ...}}",
                                     "expected name: <registry name or class path> with the options beside it",
                                     f"write {key}: {{name: {entry['class_path']}{', ' + opts if opts else ''}}}")
                name = entry.get("name") if isinstance(entry, dict) else entry
                if isinstance(name, str) and ("." in name or ":" in name):
                    resolve(name)
                check_entry_strings(section, key, entry)
    refresh_entry_types()
    return keys


def check_entry_flags(argv: list[str], keys: dict[str, set[str]]) -> None:
    """``--model.heads.<key>.<option>`` must name a head the recipe defines (a new key would silently add a head
    with the modality's default class)."""
    for a in argv:
        parts = a.split("=", 1)[0].split(".")
        if len(parts) >= 4 and parts[0] == "--model" and parts[1] == "heads" and keys["heads"] and parts[2] not in keys["heads"]:
            raise UsageError(f"{a.split('=', 1)[0]}: the model has no head {parts[2]!r}", f"expected one of: {', '.join(sorted(keys['heads']))}")


def drop_unset_options(model: Any) -> None:
    """Tokenizer and head entries as plain data without their unset (None) options, as the recipe wrote them."""
    from ..config import entry_dict

    if model is None or not hasattr(model, "get"):
        return
    for section in ("tokenizers", "heads"):
        entries = model.get(section)
        if isinstance(entries, dict):
            model[section] = {k: entry_dict(v) for k, v in entries.items()}
