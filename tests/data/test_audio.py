"""Audio preprocessing on real recordings (Free Spoken Digit Dataset, 8 kHz WAVs)."""

from __future__ import annotations

import wave

import numpy as np
import pytest
import torch
import torchaudio

from mmte.data.audio import AUDIOSET_MEAN, AUDIOSET_STD, collate_audio, compute_fbank, load_audio, preprocess_audio
from mmte.tokenizers.audio import AudioTokenizer

FILES = ["0_george_0.wav", "3_jackson_12.wav", "7_nicolas_40.wav", "9_theo_3.wav", "5_yweweler_25.wav"]


def read_wav_stdlib(path) -> tuple[torch.Tensor, int]:
    """Independent reader: the stdlib wave module, 16-bit PCM scaled by 1/32768."""
    with wave.open(str(path), "rb") as f:
        assert f.getsampwidth() == 2
        sr, n, ch = f.getframerate(), f.getnframes(), f.getnchannels()
        pcm = np.frombuffer(f.readframes(n), dtype="<i2").reshape(-1, ch).mean(1)
    return torch.from_numpy(pcm.astype(np.float32) / 32768.0), sr


def reference_fbank(path) -> torch.Tensor:
    """AST's recipe written out: resample to 16 kHz, remove the mean, Kaldi fbank (128 mel, 25/10 ms,
    Hanning, HTK mel, no energy, no dither)."""
    w, sr = read_wav_stdlib(path)
    w = torchaudio.functional.resample(w, sr, 16000)
    return torchaudio.compliance.kaldi.fbank(
        (w - w.mean())[None],
        htk_compat=True,
        sample_frequency=16000,
        use_energy=False,
        window_type="hanning",
        num_mel_bins=128,
        dither=0.0,
        frame_shift=10,
        frame_length=25,
    )


@pytest.fixture
def fsdd(shared_data):
    d = shared_data / "fsdd" / "recordings"
    if not d.is_dir():
        pytest.skip(f"FSDD recordings not found at {d}")
    return d


@pytest.mark.parametrize("name", FILES)
def test_fbank_equals_kaldi_on_fsdd(fsdd, name):
    path = fsdd / name
    w, sr = load_audio(path)
    assert sr == 8000 and w.dim() == 1 and w.dtype == torch.float32
    ref_w, _ = read_wav_stdlib(path)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-7)
    ours = preprocess_audio(path, mean=None, std=None)
    ref = reference_fbank(path)
    assert ours.shape == ref.shape and ours.shape[1] == 128
    # 10 ms frames at 16 kHz: 1 + (samples - 400) // 160
    assert ours.shape[0] == 1 + (2 * w.shape[0] - 400) // 160
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-4)
    normed = preprocess_audio(path)
    torch.testing.assert_close(normed, (ref - AUDIOSET_MEAN) / (2 * AUDIOSET_STD), rtol=1e-5, atol=1e-4)


def test_tokenizer_waveform_path_equals_fbank_path(fsdd):
    ws = [load_audio(fsdd / f)[0] for f in FILES[:3]]
    lengths = torch.tensor([len(w) for w in ws])
    wave_batch = torch.zeros(3, int(lengths.max()))
    for i, w in enumerate(ws):
        wave_batch[i, : len(w)] = w
    tok = AudioTokenizer(32, max_frames=256).eval()
    a = tok(waveform=wave_batch, lengths=lengths, sample_rate=8000)
    b = tok(**collate_audio([compute_fbank(w, 8000) for w in ws]))
    torch.testing.assert_close(a.tokens, b.tokens)
    assert torch.equal(a.mask, b.mask)


def test_collate_pads_and_counts_frames():
    a, b = torch.randn(20, 128), torch.randn(35, 128)
    out = collate_audio([a, b])
    assert out["fbank"].shape == (2, 35, 128) and out["frames"].tolist() == [20, 35]
    assert torch.equal(out["fbank"][0, :20], a) and out["fbank"][0, 20:].abs().sum() == 0


def test_too_short_waveform():
    with pytest.raises(ValueError, match="at least one 25.0 ms frame"):
        compute_fbank(torch.zeros(100), 16000)
    with pytest.raises(ValueError, match=r"mono \[T\]; got shape \(2, 100\)"):
        compute_fbank(torch.zeros(2, 100), 16000)
