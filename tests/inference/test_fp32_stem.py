"""The speech-embedding stem of a low-precision inference copy computes in fp32 (mmte.inference.keep_fp32):
its buffers stay fp32 while the backbone's GEMMs are bf16, its features equal the fp32 model's both under
``mmte predict``'s bf16 autocast and without one (``mmte serve``), and the copy's logits stay within bf16's
tolerance of the eager fp32 model. Needs the openwakeword wheel's weights (skipped without it)."""

from __future__ import annotations

import importlib.util
import logging
import math

import pytest
import torch

from mmte.data.audio import collate_audio, compute_fbank
from mmte.inference import Fp32SpeechEmbedding, release_fp32
from mmte.model import MetaTransformer
from mmte.tokenizers.speech_embedding import SpeechEmbedding

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openwakeword") is None or importlib.util.find_spec("onnx") is None,
    reason="the speech-embedding stem's weights come with openwakeword 0.4.0 (pip install 'mmte[speech]')",
)

# bf16 backbone GEMMs on a tiny model: logits within 1e-2 of eager fp32 (relative, Frobenius norm over the
# batch; measured 2e-3 without autocast, 4e-3 under it); the stem's features must equal the fp32 model's
LOGIT_RTOL = 1e-2


def _model() -> MetaTransformer:
    torch.manual_seed(0)
    return MetaTransformer(
        {"audio": {"name": "audio", "num_mel_bins": 32, "max_frames": 128, "stem": "speech_embedding"}},
        backbone="tiny",
        heads={"digit": {"name": "classification", "num_classes": 10, "pool": "mean"}},
        freeze="backbone",
    ).eval()


def _clips(n: int) -> dict[str, torch.Tensor]:
    """``n`` voiced sounds (gliding harmonics, 0.3-1.2 s at 16 kHz) as the stem's padded log-mel batch."""
    g = torch.Generator().manual_seed(1)
    mels = []
    for i in range(n):
        t = torch.arange(int(16000 * (0.3 + 0.9 * i / max(1, n - 1)))) / 16000
        f0 = 100 + 120 * torch.rand((), generator=g)
        phase = 2 * math.pi * torch.cumsum(f0 * (1 + 0.3 * t), 0) / 16000
        w = sum(math.exp(-((k * 150 - 700) / 600) ** 2) * torch.sin(k * phase) for k in range(1, 10))
        w = 0.3 * w * torch.hann_window(t.shape[0], periodic=False) + 0.003 * torch.randn(t.shape, generator=g)
        mels.append(compute_fbank(w.float(), 16000, num_mel_bins=32, frontend="speech_embedding")[:128])
    return collate_audio(mels)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref).norm() / ref.norm()).item()


def test_bf16_copy_keeps_the_speech_stem_in_fp32(caplog):
    model = _model()
    audio = _clips(6)
    batch = {"audio": audio}
    with torch.no_grad():
        ref = model(batch)["digit"]
    with caplog.at_level(logging.INFO, logger="mmte.inference.optimize"):
        inf = model.inference("bf16")
    assert "kept 1 speech-embedding stem(s) in fp32" in caplog.text
    stem = inf.model.tokenizers["audio"].stem
    assert type(stem) is Fp32SpeechEmbedding
    assert {b.dtype for b in stem.buffers()} == {torch.float32}
    convs = [b for b in stem.buffers() if b.dim() == 4]
    assert len(convs) == 20 and all(b.is_contiguous(memory_format=torch.channels_last) for b in convs)
    assert {m.weight.dtype for m in inf.model.backbone.modules() if isinstance(m, torch.nn.Linear)} == {torch.bfloat16}
    assert type(model.tokenizers["audio"].stem) is SpeechEmbedding  # the original is left alone

    # the stem's features are the fp32 model's, with or without predict's bf16 autocast around the copy
    from mmte.tokenizers.audio import _with_context

    x = _with_context(audio["fbank"], audio["frames"])
    with torch.inference_mode():
        want = model.tokenizers["audio"].stem(x)
        for autocast in (False, True):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                got = stem(x)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)  # fp32; channels-last sums in another order
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert stem(x.bfloat16()).dtype == torch.bfloat16  # the output goes back to the input's dtype

    # the copy's logits, served (no autocast) and predicted (bf16 autocast), against the eager fp32 model
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = inf(batch)["digit"]
        assert out.dtype == (torch.bfloat16 if autocast else torch.float32)  # under autocast the head's GEMM is bf16
        err = _rel(out, ref)
        assert err < LOGIT_RTOL, (autocast, err)
        assert (out.argmax(-1) == ref.argmax(-1)).all()


def test_fp32_copy_leaves_the_stem_to_autocast_and_the_swap_undoes():
    model = _model()
    inf = model.inference("fp32")
    assert type(inf.model.tokenizers["audio"].stem) is SpeechEmbedding  # bf16-mixed over an fp32 copy stays autocast
    low = model.inference("bf16").model
    keys = set(low.state_dict())
    assert release_fp32(low) == 1
    assert type(low.tokenizers["audio"].stem) is SpeechEmbedding and set(low.state_dict()) == keys
    assert all(b.is_contiguous() for b in low.tokenizers["audio"].stem.buffers())  # the default layout again
