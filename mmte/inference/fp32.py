"""Parts of a low-precision inference copy that keep computing in fp32, whatever autocast is around them.

The speech-embedding stem (:class:`~mmte.tokenizers.speech_embedding.SpeechEmbedding`: 20 small, fixed
convolutions in front of the audio tokenizer's projection) follows bf16 autocast where one is on and
computes in fp32 where none is. A bf16 inference copy meets both: ``mmte predict`` under ``bf16-mixed``
runs it inside the precision plugin's autocast, ``mmte serve`` runs it without one. Through 20
convolutions bf16 rounding adds up, so the same copy would give two different sets of features, both
further from the fp32 model the more layers they pass. :func:`keep_fp32` swaps such a module for its
fp32 variant (:class:`Fp32SpeechEmbedding`) in place, as :func:`mmte.inference.pack` swaps GEMMs: the
class changes, buffers and FQNs stay (state dicts load either way), and :func:`release_fp32` undoes it.
The variant casts its input to fp32 and its output back to the input's dtype, so what follows it
(the tokenizer's projection, the backbone's own cast to its compute dtype) sees what it saw before.

The swap also stores the convolutions' weights channels-last (NHWC), and the variant's forward puts its
input in that layout too and applies the activations in place (each convolution's output is fresh, and the
copy computes without autograd): oneDNN then runs every convolution of the stack in NHWC with no reorder
between them, the same sums in another order (within 1e-4 of the default layout's features). On this
project's 2-core AVX-512 machine the weights' layout made the stem 1.4x faster at a batch of 32 and 1.5x at
one clip; the input's layout and the in-place activations took a batch of 32 from 64 to 42 ms more
(bench/serve.py measures the served model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..tokenizers.speech_embedding import SpeechEmbedding

__all__ = ["KEPT_FP32", "Fp32SpeechEmbedding", "keep_fp32", "release_fp32"]


class Fp32SpeechEmbedding(SpeechEmbedding):
    """A :class:`~mmte.tokenizers.speech_embedding.SpeechEmbedding` that computes in fp32 under any
    autocast: log-mel ``[B, T, 32]`` in any float dtype -> ``[B, T', 96]`` in that dtype. Made in place by
    :func:`keep_fp32`."""

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        self.check_input(mel)
        with torch.autocast(mel.device.type, enabled=False):
            x = F.pad(mel.float(), (1, 1))[:, None].contiguous(memory_format=torch.channels_last)  # [B, 1, T, 34], NHWC
            for op in self.stack():
                if op[0] == "pool":
                    x = F.max_pool2d(x, op[1], op[1])
                    continue
                _, w, b, padding, first, last = op
                x = F.conv2d(x, w, b, padding=padding)
                if first:
                    x = torch.addcmul(self.bn_shift[:, None, None], F.relu_(x), self.bn_scale[:, None, None])
                if not last:
                    x = F.leaky_relu_(x, 0.2).clamp_min_(-0.4)
            return x[:, :, :, 0].transpose(1, 2).to(mel.dtype)


#: module class -> its fp32 variant, for :func:`keep_fp32`
KEPT_FP32: dict[type[nn.Module], type[nn.Module]] = {SpeechEmbedding: Fp32SpeechEmbedding}


def keep_fp32(module: nn.Module) -> int:
    """Swap every module of a class in :data:`KEPT_FP32` inside ``module`` for its fp32 variant, its
    parameters and buffers cast to fp32 and its 4-d (convolution) weights stored channels-last, in place;
    returns how many were swapped."""
    n = 0
    for m in module.modules():
        cls = KEPT_FP32.get(type(m))
        if cls is not None:
            m.float()
            for name, buf in list(m.named_buffers(recurse=False)):
                if buf.dim() == 4:
                    setattr(m, name, buf.contiguous(memory_format=torch.channels_last))
            m.__class__ = cls
            n += 1
    return n


def release_fp32(module: nn.Module) -> int:
    """Undo :func:`keep_fp32` on ``module`` (the modules compute as their class does again, on weights in
    the default layout); returns how many."""
    back = {v: k for k, v in KEPT_FP32.items()}
    n = 0
    for m in module.modules():
        cls = back.get(type(m))
        if cls is not None:
            for name, buf in list(m.named_buffers(recurse=False)):
                if buf.dim() == 4:
                    setattr(m, name, buf.contiguous())
            m.__class__ = cls
            n += 1
    return n
