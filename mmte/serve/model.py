"""The served model: a recipe and a checkpoint built the way ``mmte predict`` builds them, and the
function that turns request samples into prediction rows.

:func:`build_served` is handed the CLI's predict set-up (:func:`mmte.cli.serve.predict_setup`, which runs
:class:`~mmte.cli.app.MMTECLI`) and the same command line as ``mmte predict``
(``--config``, ``--model.*``, ``--data.*``, ``--ckpt_path best|last|<file>``), so everything predict
checks and resolves is checked and resolved here too: the checkpoint's hyperparameters define the
model, its saved data state (class map, table schema, fbank statistics) is read into the data module,
``model.predict_dtype`` is settled as predict settles it. The weights are then loaded from the
checkpoint and the module is prepared as for ``trainer.predict`` (:meth:`MMTEModule.on_predict_start`:
the inference copy of :meth:`~mmte.model.MetaTransformer.inference`), and every batch goes through
:meth:`MMTEModule.predict_step`, so an answer is the row ``mmte predict`` writes for the same file.

Runtimes (``runtime``): ``inference`` (the default: predict's inference copy), ``eager`` (the plain
fp32 model, for comparison) and ``onnx`` (onnxruntime on an ``mmte export`` graph of the same
checkpoint, for comparison).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import UsageError
from .inputs import InputSpec, input_spec
from .outputs import prediction_rows

__all__ = ["RUNTIMES", "PredictSetup", "ServedModel", "build_served"]

#: what a predict set-up returns: the LightningModule, the data module, the checkpoint path and the precision
#: plugin's predict-step context (a callable returning a context manager)
PredictSetup = tuple[Any, Any, str, Callable[[], Any]]

logger = logging.getLogger("mmte")

RUNTIMES = ("inference", "eager", "onnx")


class ServedModel:
    """A loaded checkpoint ready to answer requests.

    Args:
        module: the :class:`~mmte.training.module.MMTEModule` with the checkpoint's weights.
        datamodule: the recipe's data module with the checkpoint's data state.
        ckpt_path: the checkpoint file (for ``/info``).
        runtime: one of :data:`RUNTIMES`.
        onnx_path: the ``mmte export`` ONNX file (``runtime="onnx"``).
        step_context: the context ``trainer.predict`` runs each ``predict_step`` in (the precision plugin's:
            e.g. bf16 autocast under ``bf16-mixed``), so answers equal predict's; None: none.
    """

    def __init__(self, module: Any, datamodule: Any, ckpt_path: str, runtime: str = "inference", onnx_path: str | None = None,
                 step_context: Any = None):
        if runtime not in RUNTIMES:
            raise UsageError(f"--runtime {runtime!r} is unknown", f"expected one of {RUNTIMES}", "use --runtime inference")
        if runtime == "onnx" and not onnx_path:
            raise UsageError("--runtime onnx needs the exported graph", "expected --onnx <file.onnx> written by mmte export", "run mmte export first")
        self.module, self.datamodule, self.ckpt_path, self.runtime = module, datamodule, ckpt_path, runtime
        self.spec: InputSpec = input_spec(datamodule)
        self.class_names = list(datamodule.class_names) if getattr(datamodule, "class_names", None) else None
        module.eval()
        if runtime == "inference":
            module.on_predict_start()  # predict's own preparation: the inference copy in predict_dtype
        elif runtime == "onnx":
            object.__setattr__(module, "inference_model", OnnxRunner(onnx_path, module.model))  # what predict_step calls
        self.dtype = "fp32" if runtime != "inference" else _dtype_name(module)
        # predict's step context (bf16 autocast under bf16-mixed) makes an fp32 copy compute as predict does; a low-precision
        # copy computes in its own dtype, and its few-row path (fp32 activations on fp16-packed weights) must not be autocast
        self.step_context = step_context if runtime == "inference" and self.dtype == "fp32" else None

    def predict(self, samples: Sequence[Any], ids: Sequence[str], top_k: Sequence[int | None] | int = 0) -> list[dict[str, Any]]:
        """Samples (from :meth:`InputSpec.decode`) -> one prediction row each, batched in one forward."""
        batch = self.spec.collate(list(samples))
        with torch.inference_mode(), (self.step_context() if self.step_context is not None else contextlib.nullcontext()):
            res = self.module.predict_step(batch, 0)
        return prediction_rows(res, ids, self.class_names, top_k)

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` reports: modalities, heads (task, classes), inputs, checkpoint, runtime, dtype, version."""
        from .. import __version__

        heads = {}
        for name, head in self.module.model.heads.items():
            task = getattr(head, "task", None)
            heads[name] = {"task": task, **({"classes": self.class_names} if task == "classification" and self.class_names else {})}
        return {
            "mmte_version": __version__,
            "checkpoint": self.ckpt_path,
            "runtime": self.runtime,
            "dtype": self.dtype,
            "modalities": list(self.module.model.tokenizers.keys()),
            "inputs": self.spec.describe(),
            "heads": heads,
        }


def _dtype_name(module: Any) -> str:
    from ..inference import resolve_dtype

    return str(resolve_dtype(module.hparams.predict_dtype, module.device))


class OnnxRunner:
    """An ``mmte export`` ONNX graph behind :meth:`MMTEModule.predict_step`'s inference call (dict batch -> head outputs).

    A dimension the graph fixed (all but the batch and an audio clip's frames) is padded up to its size when a batch is shorter
    (zeros; a mask input pads with False, so the padding stays hidden). The session computes on as many threads as torch does
    in this worker (``--threads``, or the cores split between ``--workers``), so the runtimes compared share the same cores.
    """

    def __init__(self, path: str, model: torch.nn.Module):
        import onnxruntime as ort

        from ..export import model_inputs

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [(i.name, i.shape) for i in self.sess.get_inputs()]
        self.output_names = [o.name for o in self.sess.get_outputs()]
        self._model_inputs = lambda batch: model_inputs(model, batch)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        import numpy as np

        from ..export import _flatten, _unflatten

        flat = dict(_flatten(self._model_inputs(batch)))
        feed = {}
        for name, shape in self.inputs:
            a = flat[name].numpy()
            pad = [(0, 0)] + [(0, max(0, int(s) - a.shape[d + 1]) if isinstance(s, int) else 0) for d, s in enumerate(shape[1:])]
            feed[name] = np.pad(a, pad) if any(p[1] for p in pad) else a
        out = self.sess.run(self.output_names, feed)
        return _unflatten(self.output_names, tuple(torch.from_numpy(o) for o in out))


def build_served(predict_setup: Callable[[Sequence[str]], PredictSetup], argv: Sequence[str], runtime: str = "inference",
                 onnx_path: str | None = None) -> ServedModel:
    """Build the model ``mmte predict <argv>`` would predict with, weights loaded, ready to serve.

    Args:
        predict_setup: parses ``argv`` as ``mmte predict`` does and returns what ``trainer.predict`` would be
            called with (:func:`mmte.cli.serve.predict_setup`; passed in so this package stays below the CLI).
        argv: the recipe's command line as ``mmte predict`` takes it (``--config``, ``--ckpt_path``, ``--model.*``, ``--data.*``).
        runtime: one of :data:`RUNTIMES`.
        onnx_path: the ONNX file for ``runtime="onnx"``.

    Raises:
        UsageError: no ``--ckpt_path`` (a served model must be trained), or anything ``mmte predict`` refuses.
    """
    args = list(argv)
    if not any(a == "--ckpt_path" or a.startswith("--ckpt_path=") for a in args):
        raise UsageError("mmte serve needs --ckpt_path", "expected best, last or a checkpoint file written by mmte fit",
                         "add --ckpt_path best (the recipe's best checkpoint)")
    module, dm, ckpt, predict_context = predict_setup(args)
    ck = torch.load(ckpt, map_location="cpu", weights_only=True, mmap=True)
    module.configure_model()
    module.on_load_checkpoint(ck)
    module.load_state_dict(ck["state_dict"], strict=True)
    name = type(dm).__name__
    if ck.get(name):
        dm.load_state_dict(ck[name])  # what trainer.predict restores (state_from already read the same)
    del ck
    logger.info("serving %s (%s) with the %s runtime", ckpt, type(module.model).__name__, runtime)
    return ServedModel(module, dm, ckpt, runtime, onnx_path, predict_context)
