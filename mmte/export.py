"""Export a trained model for deployment: ONNX, or a ``torch.export`` program (``.pt2``).

A :class:`~mmte.model.MetaTransformer` takes a dict batch and returns a dict of head outputs;
exported graphs take and return flat tensors. :class:`FlatModel` does the translation with names:
inputs ``image``, ``text.input_ids``, ... (a modality's tensor, or each tensor of a modality's dict,
in the batch's order), outputs ``digit``, ``clip.image``, ... (each head's tensor, or each tensor of
its dict). The batch dimension is exported as dynamic, and so is every dimension a tokenizer declares
variable (an audio clip's frames: ``export_dims``); the others are fixed at the example batch's sizes.
Data-dependent input checks (a clip shorter than a patch) are skipped while exporting: the exported
graph does not validate values.

Every export is checked against the eager model on a real batch: the exported program (onnxruntime
for ONNX, the reloaded ``.pt2`` for ``torch.export``) runs the same inputs and the largest absolute
difference over all outputs is returned and printed.

``mmte export --config <recipe> --ckpt_path <ckpt> --format onnx|torch_export --out <file>`` builds the
recipe's model, loads the checkpoint (trainable-only checkpoints included), takes a batch from the
recipe's data (predict split) and writes the file.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "ExportResult", "FlatModel", "export", "export_main", "model_inputs"]

FORMATS = ("onnx", "torch_export")
_SUFFIX = {"onnx": ".onnx", "torch_export": ".pt2"}


def model_inputs(model: nn.Module, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``batch`` the model reads: its tokenizers' keys (targets, indices... dropped)."""
    keys = list(getattr(model, "tokenizers", {}).keys())
    out = {k: batch[k] for k in keys if k in batch}
    if not out:
        raise ValueError(f"the batch holds none of the model's modalities {keys}; got keys {sorted(batch)}")
    return out


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    flat = []
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, torch.Tensor):
            flat.append((name, v))
        elif isinstance(v, Mapping):
            flat.extend(_flatten(v, name + "."))
        elif v is not None:
            raise TypeError(f"cannot export {name!r}: a {type(v).__name__}, expected tensors or dicts of tensors")
    return flat


def _unflatten(names: list[str], values: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, v in zip(names, values, strict=True):
        *path, leaf = name.split(".")
        node = tree
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


class FlatModel(nn.Module):
    """``model`` with flat, named tensor inputs and outputs (what exporters and runtimes take).

    Args:
        model: a :class:`~mmte.model.MetaTransformer` (dict batch -> dict of head outputs).
        example: a batch whose modality entries fix the input names and order.
    """

    def __init__(self, model: nn.Module, example: Mapping[str, Any]):
        super().__init__()
        self.model = model
        ins = _flatten(model_inputs(model, example))
        self.input_names = [n for n, _ in ins]
        self.example_inputs = tuple(t for _, t in ins)
        with torch.no_grad():
            outs = _flatten(model(_unflatten(self.input_names, self.example_inputs)))
        self.output_names = [n for n, _ in outs]

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(_unflatten(self.input_names, inputs))
        return tuple(t for _, t in _flatten(out))


@dataclass
class ExportResult:
    """What :func:`export` wrote and how close it is to the eager model."""

    path: str
    format: str
    max_abs_diff: float
    input_names: list[str]
    output_names: list[str]
    batch_size: int
    dynamic_dims: list[str] = field(default_factory=list)  # besides the batch, e.g. "audio.fbank dim 1"

    def summary(self) -> str:
        dyn = "".join(f", {d}" for d in self.dynamic_dims)
        return (
            f"wrote {self.path} ({self.format}; inputs {self.input_names}, outputs {self.output_names}, dynamic batch{dyn}): "
            f"max abs diff vs the eager model {self.max_abs_diff:.3g} on a batch of {self.batch_size}"
        )


def _dynamic_shapes(flat: FlatModel):
    """The batch dimension of every input, and the dimensions a tokenizer declares variable
    (:meth:`~mmte.tokenizers.base.ModalityTokenizer.export_dims`, e.g. an audio clip's frames) where the
    example's size lies in the declared range; every other dimension is fixed at the example's size."""
    batch = torch.export.Dim("batch", min=1, max=65536)
    tokenizers = dict(getattr(flat.model, "tokenizers", {}).items())
    specs = []
    for name, t in zip(flat.input_names, flat.example_inputs, strict=True):
        modality, _, key = name.partition(".")
        tok = tokenizers.get(modality)
        spec = {0: batch}
        for d, (lo, hi) in (tok.export_dims().get(key, {}) if hasattr(tok, "export_dims") else {}).items():
            if d < t.dim() and lo <= t.shape[d] <= hi:
                spec[d] = torch.export.Dim(re.sub(r"\W", "_", f"{name}_{d}"), min=lo, max=hi)
        specs.append(spec)
    return {"inputs": tuple(specs)}  # forward(*inputs)


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    if len(a) != len(b):
        raise RuntimeError(f"the exported program returns {len(b)} outputs; the eager model {len(a)}")
    return max((x.detach().float() - torch.as_tensor(y).float()).abs().max().item() for x, y in zip(a, b, strict=True))


def _check_args(fmt: str, path: str, opset: int) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {FORMATS}; got {fmt!r}")
    if not path.endswith(_SUFFIX[fmt]):
        raise ValueError(f"--out for format {fmt!r} must end in {_SUFFIX[fmt]}; got {path!r}")
    if fmt == "onnx" and opset < 17:
        raise ValueError(f"ONNX opset must be >= 17 (LayerNormalization); got {opset}")


def export(model: nn.Module, batch: Mapping[str, Any], path: str | os.PathLike, fmt: str = "onnx", *, opset: int = 18) -> ExportResult:
    """Export ``model`` (fp32, eval mode) and check the file against the eager model on ``batch``.

    Args:
        model: a :class:`~mmte.model.MetaTransformer`.
        batch: a real batch (its modality entries are the example inputs; use >= 2 samples so the
            batch dimension is not specialised to 1).
        path: the output file (``.onnx`` / ``.pt2``).
        fmt: ``"onnx"`` (``torch.onnx.export``, dynamo exporter, opset ``opset``) or ``"torch_export"``
            (``torch.export.export`` saved with ``torch.export.save``).
        opset: ONNX opset (>= 17).

    Returns:
        an :class:`ExportResult` with the max abs difference of every output.

    Raises:
        ValueError: an unknown format, a suffix that does not match it, or an opset below 17.
    """
    path = os.fspath(path)
    _check_args(fmt, path, opset)
    model = model.eval()
    flat = FlatModel(model, batch)
    args = flat.example_inputs
    n = int(args[0].shape[0])
    shapes = _dynamic_shapes(flat)
    dynamic = [f"{name} dim {d}" for name, spec in zip(flat.input_names, shapes["inputs"], strict=True) for d in spec if d]
    with torch.no_grad():
        ref = list(flat(*args))
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    tmp = path + ".tmp"
    if fmt == "onnx":
        import onnxruntime as ort

        prog = torch.onnx.export(
            flat, args, dynamo=True, dynamic_shapes=shapes, input_names=flat.input_names,
            output_names=flat.output_names, opset_version=opset, optimize=True, verbose=False,
        )
        prog.save(tmp)
        os.replace(tmp, path)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = sess.run(None, {name: t.numpy() for name, t in zip(flat.input_names, args, strict=True)})
    else:
        with torch.no_grad():
            ep = torch.export.export(flat, args, dynamic_shapes=shapes)
        torch.export.save(ep, tmp)
        os.replace(tmp, path)
        loaded = torch.export.load(path).module()
        with torch.no_grad():
            got = list(loaded(*args))
    res = ExportResult(path, fmt, _max_diff(ref, got), flat.input_names, flat.output_names, n, dynamic)
    logger.info("exported %s to %s: max abs diff vs eager %.3g", type(model).__name__, path, res.max_abs_diff)
    return res


# ------------------------------------------------------------------------------------------- CLI
def _build_from_recipe(rest: list[str], ckpt: str | None, cli_class: type):
    """The recipe's LightningModule (checkpoint weights loaded) and its DataModule set up for predict.

    ``cli_class`` is the command line's LightningCLI (:class:`mmte.cli.MMTECLI`), handed in by the
    command so this module stays below the CLI.
    """
    root = tempfile.mkdtemp(prefix="mmte-export-")
    cli = cli_class(args=[*rest, "--trainer.default_root_dir", root, "--trainer.logger", "false"], run=False)
    module, dm = cli.model, cli.datamodule
    module.configure_model()
    if ckpt:
        if not os.path.isfile(ckpt):
            raise FileNotFoundError(f"--ckpt_path {ckpt} does not exist; pass a checkpoint written by mmte fit")
        ck = torch.load(ckpt, map_location="cpu", weights_only=False)
        module.on_load_checkpoint(ck)
        module.load_state_dict(ck["state_dict"], strict=True)
    module._reload_pretrained()
    dm.setup("predict")
    return module, dm


def _real_batch(dm, n: int) -> dict[str, Any]:
    ds = dm.datasets[dm.predict_split]
    if len(ds) == 0:
        raise ValueError("the recipe's predict split is empty: no real batch to check the export against")
    return dm._collate([ds[i % len(ds)] for i in range(n)])


def export_main(argv: list[str], cli_class: type) -> int:
    """``mmte export``: recipe + checkpoint -> ONNX or ``torch.export`` file, checked against eager.

    ``cli_class`` parses the recipe options (:class:`mmte.cli.MMTECLI`; :func:`mmte.cli.export_main` passes it).
    """
    p = argparse.ArgumentParser(
        prog="mmte export",
        description="Export a recipe's model (with a checkpoint's weights) to ONNX or a torch.export program and check "
        "it against the eager model on a real batch (the max abs difference is printed). Other options (--config, "
        "--model.*, --data.*) are the recipe's, as for mmte fit.",
    )
    p.add_argument("--ckpt_path", default=None, help="checkpoint written by mmte fit (default: the recipe's initial weights)")
    p.add_argument("--format", choices=FORMATS, default="onnx", help="onnx (.onnx) or torch_export (.pt2); default %(default)s")
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--opset", type=int, default=18, help="ONNX opset (>= 17; default %(default)s)")
    p.add_argument("--batch_size", type=int, default=8, help="samples in the check batch (default %(default)s)")
    a, rest = p.parse_known_args(argv)
    if "--config" not in rest and not any(r.startswith("--config=") for r in rest):
        raise ValueError("mmte export needs the recipe: --config recipes/<name>.yaml")
    _check_args(a.format, a.out, a.opset)
    if a.batch_size < 2:
        raise ValueError(f"--batch_size must be >= 2 (a batch of 1 would fix the batch dimension); got {a.batch_size}")
    module, dm = _build_from_recipe(rest, a.ckpt_path, cli_class)
    res = export(module.model, _real_batch(dm, a.batch_size), a.out, a.format, opset=a.opset)
    print(res.summary())
    return 0
