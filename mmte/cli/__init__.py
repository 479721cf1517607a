"""The ``mmte`` command: Lightning's CLI for recipes, plus ``tune``, ``serve``, ``list``, ``modalities``, ``convert``, ``export`` and ``env``.

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
    mmte export   --config recipes/quickstart.yaml --ckpt_path best --format onnx --out model.onnx
    mmte env                                                                 # versions, device, CPU flags
    mmte tune     --config recipes/quickstart.yaml --tune.space space.yaml --tune.trials 20   # Optuna, on validation
    mmte serve    --config recipes/quickstart.yaml --ckpt_path best [--port 8000]            # HTTP endpoint
    mmte fit      --config recipes/quickstart.yaml --precision auto          # bf16 where the CPU has it

One module per verb: :mod:`~mmte.cli.fit` (fit, validate, test, predict through :class:`~mmte.cli.app.MMTECLI`, after the recipe checks of :mod:`~mmte.cli.checks`),
:mod:`~mmte.cli.listing` (list, modalities), :mod:`~mmte.cli.convert`, :mod:`~mmte.cli.export`,
:mod:`~mmte.cli.env`, :mod:`~mmte.cli.tune`, :mod:`~mmte.cli.serve`. ``--ckpt_path best`` / ``last`` name ``<checkpoint folder>/{best,last}.ckpt`` in every
verb that takes a checkpoint (:mod:`~mmte.cli.checkpoint`). Lightning is imported only by the verbs that need it.

Errors (:mod:`mmte.errors`, shown by :mod:`mmte.cli.errors`): a mistake stops the command with one
``mmte: error: <what>, <expected>, <how to fix>`` line on stderr and exit status 2, before anything is
written where possible; a missing optional package names the ``pip install 'mmte[<extra>]'`` that brings
it; a run that fails by itself (a non-finite loss, a full disk) exits 1; SIGINT / SIGTERM exit 130 / 143
after saving. ``MMTE_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

from ..errors import UnknownNameError
from .checkpoint import CKPT_OVERRIDABLE, single_process_checkpoint
from .checks import LIGHTNING_COMMANDS, check_config_files
from .convert import convert_main
from .env import env_main, env_report
from .errors import describe_error
from .export import export_main
from .fit import run_lightning
from .listing import LIST_SECTIONS, list_entries, list_main, modalities_main, modalities_table
from .serve import serve_main
from .tune import tune_main

__all__ = [
    "CKPT_OVERRIDABLE",
    "COMMANDS",
    "LIGHTNING_COMMANDS",
    "LIST_SECTIONS",
    "MMTECLI",
    "check_config_files",
    "convert_main",
    "describe_error",
    "env_main",
    "env_report",
    "export_main",
    "list_entries",
    "list_main",
    "main",
    "modalities_main",
    "modalities_table",
    "single_process_checkpoint",
]

_OVERVIEW = """usage: mmte {fit,validate,test,predict,tune,serve,list,modalities,convert,export,env} ... | mmte --version

Fine-tune Meta-Transformer-style multimodal models from recipe files.

commands:
  fit          train a model: mmte fit --config recipes/quickstart.yaml (stack more --config fragments
               from configs/ to change backbone, freeze policy, precision or parallelism; resume with
               --ckpt_path last)
  validate     evaluate a checkpoint on the validation split (--ckpt_path best | last | <file>)
  test         evaluate a checkpoint on the test split (--ckpt_path)
  predict      write predictions of a checkpoint to CSV/JSON (--ckpt_path, --prediction_writer.output)
  tune         search a recipe's settings on the validation split with Optuna, each trial an mmte fit:
               mmte tune --config <recipe> --tune.space space.yaml --tune.trials 20 (docs/tuning.md)
  serve        a checkpoint behind a batched HTTP endpoint (LitServe): mmte serve --config <recipe>
               --ckpt_path best [--port 8000] (docs/serving.md)
  list         what mmte knows by name, one line each: mmte list [modalities|heads|presets|sources|
               strategies|recipes|fragments]
  modalities   the registered modalities as a table (tokenizer, default head, input)
  convert      turn timm / Hugging Face / Meta-Transformer weights into an mmte .safetensors file
  export       write a checkpoint's model as ONNX or a torch.export program, checked against eager
  env          versions (mmte, torch, lightning, timm, onnxruntime), device, CPU flags, threads

`mmte <command> --help` explains a command's options; `--print_config` shows a merged recipe.
Exit status: 0 done, 2 bad input, 1 the run failed, 130/143 stopped by SIGINT/SIGTERM (checkpoint saved).
"""

#: the other (non-Lightning) verbs: name -> main(argv) -> exit status
COMMANDS = {"list": list_main, "modalities": modalities_main, "convert": convert_main, "env": env_main, "export": export_main, "tune": tune_main, "serve": serve_main}


def __getattr__(name: str):
    if name == "MMTECLI":  # imports Lightning: loaded on first use, so `mmte list` / `mmte env` stay quick
        from .app import MMTECLI

        return MMTECLI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mmte`` console script and ``python -m mmte``; returns the exit status. Run as the
    console command (``argv`` None), the process ends here through :func:`mmte.cli._exit.exit_now` unless
    ``MMTE_FAST_EXIT=0``.

    Args:
        argv: the command line after ``mmte`` (default ``sys.argv[1:]``).
    """
    code = _main(argv)
    if argv is None:
        from ._exit import exit_now, fast_exit_enabled

        if fast_exit_enabled():
            exit_now(code)
    return code


def _main(argv: list[str] | None) -> int:
    from .._signals import install_cli_signal_handlers
    from ..errors import Interrupted
    from ._logs import setup_logging

    from_sys = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("MMTE_DEBUG", "") not in ("", "0")
    setup_logging()
    if not argv or argv[0] in ("-h", "--help"):
        print(_OVERVIEW)
        return 0
    if argv[0] in ("--version", "-V"):
        from .. import __version__

        print(f"mmte {__version__}")
        return 0
    restore = install_cli_signal_handlers()
    try:
        if argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        if argv[0] not in LIGHTNING_COMMANDS and not argv[0].startswith("-"):
            raise UnknownNameError("command", argv[0], [*LIGHTNING_COMMANDS, *COMMANDS], "see mmte --help")
        return run_lightning(argv, from_sys)
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
