"""`mmte.export` of a model with the audio tokenizer: the clip-length check is skipped while tracing (it
reads the frame counts' values), the frames dimension is exported dynamic (a patch's frames to max_frames), and
onnxruntime on the file equals the eager model at other batch sizes and clip lengths than the export saw,
padded clips included. The patch stem always; the speech-embedding stem where openwakeword is installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mmte.export import export
from mmte.model import MetaTransformer

ort = pytest.importorskip("onnxruntime")

# fp32 on both sides; onnxruntime's kernels sum in another order: logits agree to ~1e-6, allowed 1e-4
ATOL = 1e-4
SPEECH = pytest.mark.skipif(importlib.util.find_spec("openwakeword") is None or importlib.util.find_spec("onnx") is None,
                            reason="the speech-embedding stem's weights come with openwakeword 0.4.0 (pip install 'mmte[speech]')")
STEMS = {
    "patch": {"patch_size": [32, 4], "stride": [32, 4]},  # frame-level tokens of 4 frames
    "speech_embedding": {"stem": "speech_embedding"},
}


def _model(stem: str) -> MetaTransformer:
    torch.manual_seed(0)
    return MetaTransformer(
        {"audio": {"name": "audio", "num_mel_bins": 32, "max_frames": 96, **STEMS[stem]}},
        backbone="tiny",
        heads={"digit": {"name": "classification", "num_classes": 10, "pool": "mean"}},
    ).eval()


def _batch(frames: list[int], t: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = t or max(frames)
    fbank = torch.randn(len(frames), t, 32, generator=g)
    for i, n in enumerate(frames):
        fbank[i, n:] = 0.0  # padding, as the collate pads
    return {"fbank": fbank, "frames": torch.tensor(frames)}


@pytest.mark.parametrize("stem", ["patch", pytest.param("speech_embedding", marks=SPEECH)])
def test_audio_model_exports_to_onnx_with_dynamic_frames(stem, tmp_path):
    model = _model(stem)
    path = tmp_path / "audio.onnx"
    res = export(model, {"audio": _batch([60, 41, 17])}, path, "onnx")
    assert res.input_names == ["audio.fbank", "audio.frames"] and res.output_names == ["digit"]
    assert res.dynamic_dims == ["audio.fbank dim 1"] and "dynamic batch, audio.fbank dim 1)" in res.summary()
    assert res.max_abs_diff < ATOL
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.shape for i in sess.get_inputs()] == [["batch", "audio_fbank_1", 32], ["batch"]]
    # other batch sizes and clip lengths than the export's, longer (up to max_frames) and shorter, padded or not
    for seed, (frames, t) in enumerate([([96, 30], None), ([8], None), ([20, 33, 12, 25, 9], 40)]):
        audio = _batch(frames, t, seed + 1)
        with torch.no_grad():
            ref = model({"audio": audio})["digit"]
        (got,) = sess.run(None, {"audio.fbank": audio["fbank"].numpy(), "audio.frames": audio["frames"].numpy()})
        assert got.shape == (len(frames), 10)
        assert (torch.from_numpy(got) - ref).abs().max().item() < ATOL, (frames, t)


def test_short_clip_is_still_refused_in_eager_mode():
    """The check the export skips (it reads values) still stops a clip shorter than a patch in eager mode."""
    model = _model("patch")
    with pytest.raises(ValueError, match=r"^every clip needs >= 4 frames \(patch_size=\[32, 4\]\); got frames \[12, 3\]$"):
        model({"audio": _batch([12, 3])})
