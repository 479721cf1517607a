"""Google's pretrained speech embedding (Lin et al. 2020, "Training keyword spotters with limited and
synthesized speech data"), as a fixed feature extractor for the audio tokenizer (``stem: speech_embedding``).

The network is 20 small convolutions over the 32-band log-mel of :func:`mmte.data.audio.speech_mel`
(``frontend: speech_embedding``), trained by Google on a large keyword-spotting corpus of many speakers:
what a handful of training speakers cannot teach (how a word sounds in any voice) comes with it. It
maps 76 frames (about 0.78 s) to one 96-d vector, and being fully convolutional over time it gives one
vector every 8 frames (80 ms) of a longer input.

Layout (time x frequency, NCHW): the 32 bands are zero-padded to 34; a 3x3 convolution (24 channels,
no bias), ReLU and a batch norm (folded into a fixed scale and shift); then pairs of a (1, 3)
convolution (frequency, padded) and a (3, 1) convolution (time, valid), each convolution followed by
LeakyReLU(0.2) and a floor at -0.4: one pair at 24 channels, then two pairs at each of 48, 72, 96 and 96
channels, with a max pool after each group, (2, 2), (1, 2), (2, 2), (1, 2), (2, 2) (time, frequency);
a last (3, 1) convolution without bias or activation gives the 96-d vector.

The weights are read from the ONNX file that the ``openwakeword`` 0.4.0 wheel ships
(``openwakeword/resources/models/embedding_model.onnx``, Apache-2.0; ``pip install 'mmte[speech]'``),
with the ``onnx`` package; nothing is downloaded. They are buffers, not parameters: the extractor stays
fixed whatever the freeze policy, and rides along in every checkpoint.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SpeechEmbedding", "default_weights_path", "read_weights"]

WINDOW, HOP, WIDTH = 76, 8, 96  # frames a vector sees, frames between vectors, vector width
# (out channels, kernel) of the 20 convolutions; "P" marks a max pool (its (time, freq) kernel = stride)
_LAYOUT = [(24, (3, 3)), (24, (1, 3)), (24, (3, 1)), ("P", (2, 2)),
           (48, (1, 3)), (48, (3, 1)), (48, (1, 3)), (48, (3, 1)), ("P", (1, 2)),
           (72, (1, 3)), (72, (3, 1)), (72, (1, 3)), (72, (3, 1)), ("P", (2, 2)),
           (96, (1, 3)), (96, (3, 1)), (96, (1, 3)), (96, (3, 1)), ("P", (1, 2)),
           (96, (1, 3)), (96, (3, 1)), (96, (1, 3)), (96, (3, 1)), ("P", (2, 2)),
           (96, (3, 1))]
_CONVS = [c for c in _LAYOUT if c[0] != "P"]
_LAST = len(_CONVS) - 1  # the last convolution: no bias, no activation
_PREFIX = "model/conv2d{}/"


def default_weights_path() -> str:
    """The ONNX file inside the installed ``openwakeword`` package (found without importing it).

    Raises:
        FileNotFoundError: the package (0.4.0, the last release that ships its models) is not installed.
    """
    spec = importlib.util.find_spec("openwakeword")
    path = None if spec is None or not spec.submodule_search_locations else os.path.join(
        next(iter(spec.submodule_search_locations)), "resources", "models", "embedding_model.onnx")
    if path is None or not os.path.isfile(path):
        raise FileNotFoundError(
            "the audio tokenizer's stem speech_embedding reads Google's speech-embedding weights from the openwakeword "
            f"0.4.0 wheel{f' (looked for {path})' if path else ''}; install it with pip install 'mmte[speech]' "
            "(or pip install openwakeword==0.4.0), or give stem_weights: /path/to/embedding_model.onnx")
    return path


@functools.lru_cache(maxsize=4)
def _read(path: str) -> tuple[dict[str, torch.Tensor], list[str], float]:
    """The file's initializers, and the inputs and epsilon of its one batch norm."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:  # pragma: no cover - onnx is in the speech and dev extras
        raise ImportError("reading the speech-embedding weights needs the onnx package: pip install 'mmte[speech]'") from e
    if not os.path.isfile(path):
        raise FileNotFoundError(f"speech-embedding weights not found: {path}")
    graph = onnx.load(path).graph
    init = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()).float() for i in graph.initializer}
    bn = [n for n in graph.node if n.op_type == "BatchNormalization"]
    if len(bn) != 1:
        raise ValueError(f"not a speech-embedding model: {len(bn)} batch norms in {path} (one expected)")
    eps = next((a.f for a in bn[0].attribute if a.name == "epsilon"), 1e-5)
    return init, list(bn[0].input[1:5]), float(eps)


def read_weights(path: str | os.PathLike | None = None) -> dict[str, torch.Tensor]:
    """The convolutions' weights ``w{i}`` and biases ``b{i}`` and the first batch norm folded into
    ``bn_scale``/``bn_shift``, from ``embedding_model.onnx`` (None: :func:`default_weights_path`).

    Raises:
        ValueError: the file does not hold the expected tensors (the missing names listed).
    """
    where = os.fspath(path) if path is not None else default_weights_path()
    init, bn, eps = _read(where)
    out: dict[str, torch.Tensor] = {}
    missing = [k for k in bn if k not in init]
    for i in range(len(_CONVS)):
        tag = _PREFIX.format(f"_{i}" if i else "")
        if i == 0:
            keys = {"w0": tag + "StatefulPartitionedCall/StatefulPartitionedCall/Conv2D/ReadVariableOp:0"}
        elif i == _LAST:
            keys = {f"w{i}": tag + "Conv2D/ReadVariableOp:0"}
        else:
            keys = {f"w{i}": tag + "Conv2D_weights_fused_bn", f"b{i}": tag + "Conv2D_bias_fused_bn"}
        for k, name in keys.items():
            if name in init:
                out[k] = init[name]
            else:
                missing.append(name)
    if missing:
        raise ValueError(f"not a speech-embedding model: {where} lacks {missing}")
    gamma, beta, mean, var = (init[k] for k in bn)
    out["bn_scale"] = gamma / (var + eps).sqrt()
    out["bn_shift"] = beta - mean * out["bn_scale"]
    return out


class SpeechEmbedding(nn.Module):
    """Log-mel ``[B, T, 32]`` (:func:`mmte.data.audio.speech_scale`'s scale) -> ``[B, (T - 76) // 8 + 1, 96]``.

    Args:
        weights: ``"openwakeword"`` (the installed package's file), a path to ``embedding_model.onnx``,
            or None (random, fixed weights of the same shapes: for tests).
    """

    def __init__(self, weights: str | os.PathLike | None = "openwakeword", *, device: torch.device | str | None = None):
        super().__init__()
        self.weights = None if weights is None else ("openwakeword" if weights == "openwakeword" else os.fspath(weights))
        cin = 1
        for i, (out, k) in enumerate(_CONVS):
            self.register_buffer(f"w{i}", torch.empty(out, cin, *k, device=device))
            if 0 < i < _LAST:
                self.register_buffer(f"b{i}", torch.empty(out, device=device))
            cin = out
        self.register_buffer("bn_scale", torch.empty(_CONVS[0][0], device=device))
        self.register_buffer("bn_shift", torch.empty(_CONVS[0][0], device=device))
        if self.w0.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """(Re)load the pretrained weights (random ones when ``weights`` is None)."""
        if self.weights is None:
            g = torch.Generator().manual_seed(0)
            for name, buf in self.named_buffers():
                fan_in = buf[0].numel() if buf.dim() > 1 else 1
                val = torch.randn(buf.shape, generator=g) / fan_in ** 0.5 if buf.dim() > 1 else torch.zeros(buf.shape)
                buf.copy_(torch.ones(buf.shape) if name == "bn_scale" else val)
            return
        path = None if self.weights == "openwakeword" else self.weights
        w = read_weights(path)
        with torch.no_grad():
            for name, buf in self.named_buffers():
                src = w.get(name)
                if src is None or tuple(src.shape) != tuple(buf.shape):
                    raise ValueError(f"speech-embedding weight {name}: expected shape {tuple(buf.shape)}, got "
                                     f"{None if src is None else tuple(src.shape)} from {path or default_weights_path()}")
                buf.copy_(src)

    @staticmethod
    def check_input(mel: torch.Tensor) -> None:
        """Raise ValueError unless ``mel`` is a log-mel ``[B, T >= 76, 32]``."""
        if mel.dim() != 3 or mel.shape[-1] != 32 or mel.shape[1] < WINDOW:
            raise ValueError(f"speech embedding expects a log-mel [B, T >= {WINDOW}, 32]; got shape {tuple(mel.shape)}")

    def stack(self) -> Iterator[tuple]:
        """The network in order, as it maps onto this module's buffers: ``("pool", kernel)`` for a max pool
        (stride = kernel), ``("conv", weight, bias or None, padding, first, last)`` for a convolution (``first``:
        the one followed by ReLU and the batch norm's scale and shift; every convolution but the ``last`` is
        followed by LeakyReLU(0.2) and a floor at -0.4). Shared by :meth:`forward` and the inference copy's variant
        (:class:`mmte.inference.Fp32SpeechEmbedding`)."""
        i = 0
        for out, k in _LAYOUT:
            if out == "P":
                yield "pool", k
                continue
            yield ("conv", getattr(self, f"w{i}"), getattr(self, f"b{i}") if 0 < i < _LAST else None,
                   (0, 1) if k == (1, 3) else 0, i == 0, i == _LAST)
            i += 1

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        self.check_input(mel)
        dt = self.w0.dtype if not torch.is_autocast_enabled(mel.device.type) else torch.get_autocast_dtype(mel.device.type)
        x = F.pad(mel.to(dt), (1, 1))[:, None]  # [B, 1, T, 34]
        for op in self.stack():
            if op[0] == "pool":
                x = F.max_pool2d(x, op[1], op[1])
                continue
            _, w, b, padding, first, last = op
            x = F.conv2d(x, w.to(x.dtype), None if b is None else b.to(x.dtype), padding=padding)
            if first:
                x = F.relu(x) * self.bn_scale.to(x.dtype)[:, None, None] + self.bn_shift.to(x.dtype)[:, None, None]
            if not last:
                x = F.leaky_relu(x, 0.2).clamp_min(-0.4)
        return x[:, :, :, 0].transpose(1, 2)  # [B, 96, T', 1] -> [B, T', 96]
