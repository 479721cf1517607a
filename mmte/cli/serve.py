"""``mmte serve``: a trained checkpoint behind an HTTP endpoint (LitServe), batched.

::

    mmte serve --config recipes/quickstart.yaml --ckpt_path best [--host 127.0.0.1] [--port 8000]
               [--max_batch_size 32] [--batch_timeout 0] [--workers 1] [--top_k 0] [--max_body_mb 16]

The rest of the command line is ``mmte predict``'s (``--config``, ``--ckpt_path``, ``--model.*``,
``--data.*``), so a predict command serves by changing the verb. The model is built and checked once
in this process before the server starts (a bad recipe or checkpoint is one ``mmte: error:`` line,
exit 2), then in each worker. See :mod:`mmte.serve` and docs/serving.md.
"""

from __future__ import annotations

import argparse
import functools
import gc
from collections.abc import Sequence
from typing import Any

from ..errors import UsageError

__all__ = ["predict_setup", "serve_main", "served_model"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mmte serve",
        description="Serve a checkpoint over HTTP: POST /predict (a multipart upload per modality, JSON arrays or "
        "table rows), GET /health, GET /info. Other options (--config, --ckpt_path, --model.*, --data.*) are mmte predict's.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on: 127.0.0.1 (this machine, default), 0.0.0.0 (every interface) or ::")
    p.add_argument("--port", type=int, default=8000, help="TCP port (1024-65535; default %(default)s)")
    p.add_argument("--max_batch_size", type=int, default=32, help="most requests run as one batch (default %(default)s)")
    p.add_argument("--batch_timeout", type=float, default=0.0,
                   help="seconds to wait for more requests once one is there; 0 (default): batch what is already queued")
    p.add_argument("--workers", type=int, default=1, help="inference worker processes, each with its own model (default %(default)s)")
    p.add_argument("--top_k", type=int, default=0, help="add the k most probable classes to each answer (default 0: none; a request's top_k wins)")
    p.add_argument("--max_body_mb", type=float, default=16.0, help="largest request body in MiB (default %(default)s)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a request may wait in the queue before a 504 (default %(default)s)")
    p.add_argument("--runtime", default="inference", choices=("inference", "eager", "onnx"),
                   help="inference: predict's inference copy (default); eager: the plain fp32 model; onnx: onnxruntime on --onnx (both for comparison)")
    p.add_argument("--onnx", default=None, help="the mmte export ONNX file of the same checkpoint (--runtime onnx)")
    p.add_argument("--log_level", default="warning", help="server log level (default %(default)s)")
    return p


def _check(a: argparse.Namespace) -> None:
    if not 1024 <= a.port <= 65535:
        raise UsageError(f"--port {a.port} is out of range", "expected 1024-65535", "use e.g. --port 8000")
    if a.host not in ("127.0.0.1", "0.0.0.0", "::"):
        raise UsageError(f"--host {a.host!r} is not supported", "expected 127.0.0.1, 0.0.0.0 or ::", "use --host 127.0.0.1 (or 0.0.0.0 for every interface)")
    for name in ("max_batch_size", "workers"):
        if getattr(a, name) < 1:
            raise UsageError(f"--{name} is {getattr(a, name)}", "expected an integer >= 1", f"set --{name} 1")
    if a.batch_timeout < 0 or a.batch_timeout >= a.timeout:
        raise UsageError(f"--batch_timeout is {a.batch_timeout}", f"expected >= 0 and below --timeout ({a.timeout})", "set --batch_timeout 0")
    if a.top_k < 0 or a.max_body_mb <= 0:
        raise UsageError(f"--top_k {a.top_k} / --max_body_mb {a.max_body_mb}", "expected top_k >= 0 and max_body_mb > 0", "use the defaults")


def predict_setup(argv: Sequence[str]) -> tuple[Any, Any, str, Any]:
    """Parse ``argv`` as ``mmte predict`` does and return what ``trainer.predict`` would be called with: the
    LightningModule, the data module, the resolved checkpoint path and the precision plugin's predict-step
    context. Nothing is run."""
    from .app import MMTECLI

    class _PredictSetup(MMTECLI):
        """MMTECLI whose ``predict`` keeps what ``trainer.predict`` would be called with instead of running it."""

        def predict(self, model: Any, datamodule: Any = None, ckpt_path: str | None = None, **_: Any) -> None:
            self.served = (model, datamodule, ckpt_path)

    cli = _PredictSetup(args=["predict", *argv, "--trainer.logger", "false"])
    module, dm, ckpt = cli.served
    return module, dm, ckpt, cli.trainer.strategy.precision_plugin.predict_step_context


def served_model(argv: Sequence[str], runtime: str = "inference", onnx_path: str | None = None) -> Any:
    """:func:`mmte.serve.build_served` with this CLI's :func:`predict_setup`: the model ``mmte predict <argv>``
    would predict with, loaded and ready to serve."""
    from ..serve import build_served

    return build_served(predict_setup, argv, runtime, onnx_path)


def serve_main(argv: list[str]) -> int:
    """``mmte serve``: see the module docstring; returns the exit status (143 after SIGTERM, 130 after SIGINT)."""
    a, recipe = _parser().parse_known_args(argv)
    _check(a)
    if not any(r in ("--config", "-c") or r.startswith("--config=") for r in recipe):
        raise UsageError("mmte serve needs the recipe", "expected --config recipes/<name>.yaml and --ckpt_path", "pass the flags of your mmte predict command")
    try:
        import litserve  # noqa: F401
        import multipart  # noqa: F401
    except ImportError as e:
        raise ImportError(f"mmte serve needs LitServe and python-multipart ({e}); pip install 'mmte[serve]'") from None
    from ..serve import ServeAPI, build_served, run_server

    if a.workers > 1 and not any(r == "--threads" or r.startswith("--threads=") for r in recipe):
        from ..training.threads import physical_cores

        recipe = [*recipe, "--threads", str(max(1, physical_cores() // a.workers))]  # the cores shared by the workers
    served = build_served(predict_setup, recipe, a.runtime, a.onnx)  # checked here, once: a bad recipe or checkpoint is one error line
    info = served.info()
    del served
    gc.collect()
    api = ServeAPI(functools.partial(build_served, predict_setup, recipe, a.runtime, a.onnx), max_batch_size=a.max_batch_size, batch_timeout=a.batch_timeout,
                   top_k=a.top_k)
    print(f"mmte serve: http://{a.host}:{a.port}/predict ({', '.join(info['modalities'])} -> {', '.join(info['heads'])}; "
          f"{info['runtime']} {info['dtype']}); GET /health, GET /info; stop with SIGTERM or Ctrl-C", flush=True)
    return run_server(api, info, a.host, a.port, a.workers, int(a.max_body_mb * 2**20), a.timeout, a.log_level)
