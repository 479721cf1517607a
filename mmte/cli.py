"""The ``mmte`` command: Lightning's CLI for recipes, plus ``modalities`` and ``convert``.

::

    mmte fit      --config recipes/quickstart.yaml [--config configs/encoders/tiny.yaml ...] [--trainer.max_epochs 3]
    mmte validate --config recipes/quickstart.yaml --ckpt_path runs/quickstart/checkpoints/last.ckpt
    mmte test     --config ... --ckpt_path ...
    mmte predict  --config recipes/quickstart.yaml --ckpt_path runs/quickstart/checkpoints/last.ckpt [--prediction_writer.output preds.json]
    mmte fit      --config recipes/quickstart.yaml --ckpt_path last          # resume
    mmte fit      --config recipes/quickstart.yaml --print_config            # the merged configuration
    mmte modalities                                                          # registered modalities
    mmte convert  --from hf /path/to/bert --out bert.safetensors             # weights -> mmte file

Defaults the recipes build on: a progress bar, a CSV logger in ``<default_root_dir>/logs/version_N``
(config.yaml beside it), :class:`~mmte.training.callbacks.MMTECheckpoint` writing
``<default_root_dir>/checkpoints/{best,last}.ckpt`` (monitor: the model's main validation metric),
a learning-rate monitor, and the data's ``model_info`` (classes, channels, horizon...) linked into
``model.data_info``. Bad input stops the command with one ``mmte: error: ...`` line before training,
and a log folder created by a failed run is removed (``MMTE_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from typing import Any

__all__ = ["MMTECLI", "convert_main", "main", "modalities_main", "modalities_table"]  # noqa: F822 (MMTECLI: lazy)

logger = logging.getLogger("mmte")

_OVERVIEW = """usage: mmte {fit,validate,test,predict,modalities,convert} ...

Fine-tune Meta-Transformer-style multimodal models from recipe files.

commands:
  fit          train a model: mmte fit --config recipes/quickstart.yaml (stack more --config fragments
               from configs/ to change backbone, freeze policy, precision or parallelism; resume with
               --ckpt_path last)
  validate     evaluate a checkpoint on the validation split (--ckpt_path)
  test         evaluate a checkpoint on the test split (--ckpt_path)
  predict      write predictions of a checkpoint to CSV/JSON (--ckpt_path, --prediction_writer.output)
  modalities   list the registered modalities, their tokenizers and default heads
  convert      turn timm / Hugging Face / Meta-Transformer weights into an mmte .safetensors file

`mmte <command> --help` explains a command's options; `--print_config` shows a merged recipe.
"""


def _cli_class():
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

    from .training.callbacks import MMTECheckpoint, PredictionWriter
    from .training.datamodule import MMTEDataModule
    from .training.module import MMTEModule

    class MMTECLI(LightningCLI):
        """LightningCLI for :class:`MMTEModule` and any :class:`MMTEDataModule` subclass."""

        def __init__(self, args: Any = None, run: bool = True, **kwargs: Any):
            kwargs.setdefault("save_config_kwargs", {"overwrite": True})
            kwargs.setdefault("seed_everything_default", 0)
            kwargs.setdefault("trainer_defaults", {"callbacks": [LearningRateMonitor(logging_interval="step")]})
            kwargs.setdefault("parser_kwargs", {"description": "mmte: fine-tune multimodal models from recipe files", "env_prefix": "MMTE"})
            super().__init__(MMTEModule, MMTEDataModule, subclass_mode_data=True, args=args, run=run, auto_configure_optimizers=False, **kwargs)

        def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            parser.add_lightning_class_args(MMTECheckpoint, "checkpoint")
            parser.add_lightning_class_args(PredictionWriter, "prediction_writer")
            parser.link_arguments("data.model_info", "model.data_info", apply_on="instantiate")
            parser.add_argument("--threads", type=int | None, default=None,
                                help="torch intra-op threads (default: $MMTE_THREADS, $OMP_NUM_THREADS, else physical cores // local ranks)")

        def _section(self):
            return self.config.get(self.subcommand) if self.subcommand else self.config

        def before_instantiate_classes(self) -> None:
            from jsonargparse import Namespace

            from .training.threads import set_threads

            c = self._section()
            set_threads(c.get("threads"), c.trainer.devices, c.trainer.accelerator)
            root = c.trainer.default_root_dir or os.path.join("runs", "mmte")
            c.trainer.default_root_dir = root
            if c.trainer.logger in (None, True):
                c.trainer.logger = Namespace(class_path="lightning.pytorch.loggers.CSVLogger", init_args=Namespace(save_dir=root, name="logs"))
            if c.checkpoint.dirpath is None:
                c.checkpoint.dirpath = os.path.join(root, "checkpoints")
            # the data state (class map, table schema, scalers) comes from the checkpoint being evaluated
            from .training.datamodule import checkpoint_for_state

            ckpt = checkpoint_for_state(c.get("ckpt_path"), c.checkpoint.dirpath)
            init = c.data.get("init_args") if c.get("data") is not None and hasattr(c.data, "get") else None
            if ckpt and init is not None and "state_from" in init and init.state_from is None:
                init.state_from = ckpt

        def _run_subcommand(self, subcommand: str) -> None:
            log_dir = self.trainer.log_dir
            root = self.trainer.default_root_dir
            existed = {d: d is not None and os.path.isdir(d) for d in (log_dir, root, os.path.dirname(log_dir or ""))}
            ckpt_dir = self.config_init[subcommand].checkpoint.dirpath if subcommand in self.config_init else None
            before = set(os.listdir(ckpt_dir)) if ckpt_dir and os.path.isdir(ckpt_dir) else set()
            try:
                super()._run_subcommand(subcommand)
            except BaseException:
                # nothing half-written: folders this run created go, unless a checkpoint was saved
                saved = ckpt_dir and os.path.isdir(ckpt_dir) and (set(os.listdir(ckpt_dir)) - before)
                if not saved:
                    for d in (log_dir, os.path.dirname(log_dir or ""), root):
                        if d and not existed[d] and os.path.isdir(d):
                            shutil.rmtree(d, ignore_errors=True)
                raise

    return MMTECLI


def __getattr__(name: str):
    if name == "MMTECLI":
        return _cli_class()
    raise AttributeError(name)


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
    p.add_argument("--from", dest="kind", required=True, choices=["hf", "timm", "meta-transformer", "named"],
                   help="hf: a local Hugging Face BERT/ViT/CLIP-vision folder; timm: a timm model name (with --checkpoint); "
                        "meta-transformer: the release's .pth; named: a named source such as minilm-l6")
    p.add_argument("source", help="folder, model name, file or named source")
    p.add_argument("--out", required=True, help="output .safetensors path")
    p.add_argument("--checkpoint", help="timm: local weights file for the model (nothing is downloaded)")
    p.add_argument("--preset", default="meta-transformer-b16", help="meta-transformer: the backbone shape (default %(default)s)")
    a = p.parse_args(argv)
    if not a.out.endswith(".safetensors"):
        raise ValueError(f"--out must end in .safetensors; got {a.out!r}")
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
            raise ValueError(f"unknown named source {a.source!r}; known: {sorted(BACKBONE_SOURCES)}")
        backbone = resolve_backbone_source(a.source)
    elif a.kind == "timm":
        import timm

        if a.checkpoint and not os.path.isfile(a.checkpoint):
            raise FileNotFoundError(f"--checkpoint {a.checkpoint} not found")
        model = timm.create_model(a.source, pretrained=False, checkpoint_path=a.checkpoint or "")
        backbone = from_timm(model).backbone
    else:
        backbone = load_meta_transformer(a.source, a.preset)
    del from_hf
    sd = {k: v.contiguous() for k, v in backbone.state_dict().items()}
    meta = {"format": "mmte-backbone", "config": json.dumps(dataclasses.asdict(backbone.config)), "source": f"{a.kind}:{a.source}"}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    save_file(sd, tmp, metadata=meta)
    os.replace(tmp, a.out)
    n = sum(v.numel() for v in sd.values())
    print(f"wrote {a.out}: {len(sd)} tensors, {n:,} parameters, {backbone.config.num_layers}x{backbone.config.hidden_size} ({a.kind}:{a.source})")
    return 0


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mmte`` console script and ``python -m mmte``."""
    from_sys = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("MMTE_DEBUG", "") not in ("", "0")
    mlog = logging.getLogger("mmte")
    if not mlog.handlers:  # one line per transformation applied (DESIGN.md house style)
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("mmte: %(message)s"))
        mlog.addHandler(h)
        mlog.setLevel(logging.INFO)
        mlog.propagate = False
    if not argv or argv[0] in ("-h", "--help"):
        print(_OVERVIEW)
        return 0
    try:
        if argv[0] == "modalities":
            return modalities_main(argv[1:])
        if argv[0] == "convert":
            return convert_main(argv[1:])
        _cli_class()(args=None if from_sys else argv)
        return 0
    except (ValueError, TypeError, KeyError, FileNotFoundError, NotADirectoryError, ImportError) as e:
        if debug:
            raise
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"mmte: error: {_root_message(e, msg)}", file=sys.stderr)
        return 2


def _root_message(e: BaseException, msg: str) -> str:
    """The innermost cause's message (jsonargparse wraps errors raised in constructors)."""
    seen = e
    while seen.__cause__ is not None or (seen.__context__ is not None and not seen.__suppress_context__):
        seen = seen.__cause__ or seen.__context__
    inner = str(seen).strip() or msg
    return " ".join(inner.splitlines()[0:1]) if inner else msg


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
