"""Audio preprocessing on real recordings (Free Spoken Digit Dataset, 8 kHz WAVs)."""

from __future__ import annotations

import wave

import numpy as np
import pytest
import torch
import torchaudio

from mmte.data.audio import AUDIOSET_MEAN, AUDIOSET_STD, collate_audio, compute_fbank, load_audio, preprocess_audio, resampler
from mmte.tokenizers.audio import AudioTokenizer

FILES = ["0_george_0.wav", "3_jackson_12.wav", "7_nicolas_40.wav", "9_theo_3.wav", "5_yweweler_25.wav"]


def read_wav_stdlib(path) -> tuple[torch.Tensor, int]:
    """Independent reader: the stdlib wave module, 16-bit PCM scaled by 1/32768."""
    with wave.open(str(path), "rb") as f:
        assert f.getsampwidth() == 2
        sr, n, ch = f.getframerate(), f.getnframes(), f.getnchannels()
        pcm = np.frombuffer(f.readframes(n), dtype="<i2").reshape(-1, ch).mean(1)
    return torch.from_numpy(pcm.astype(np.float32) / 32768.0), sr


def kaldi_fbank_numpy(w: np.ndarray, sr: int = 16000, num_mel_bins: int = 128, frame_length: float = 25.0, frame_shift: float = 10.0,
                      low_freq: float = 20.0) -> np.ndarray:
    """Kaldi's log-mel filterbank written out in numpy (float64), independently of torchaudio: frames with
    snip_edges, each frame's DC offset removed, pre-emphasis 0.97, a Hann window ``0.5 - 0.5 cos(2 pi n / (N - 1))``,
    a power spectrum zero-padded to the next power of two, triangular filters equally spaced on Kaldi's mel scale
    ``1127 ln(1 + f / 700)`` from 20 Hz to Nyquist (the Nyquist bin excluded), log floored at float32 eps."""
    w = np.asarray(w, dtype=np.float64)
    n_win, n_shift = int(sr * frame_length / 1000), int(sr * frame_shift / 1000)
    n_frames = 1 + (w.size - n_win) // n_shift
    frames = np.stack([w[i * n_shift : i * n_shift + n_win] for i in range(n_frames)])
    frames = frames - frames.mean(1, keepdims=True)
    frames = frames - 0.97 * np.concatenate([frames[:, :1], frames[:, :-1]], 1)
    frames = frames * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_win) / (n_win - 1)))
    n_fft = 1 << (n_win - 1).bit_length()
    power = np.abs(np.fft.rfft(frames, n_fft)) ** 2

    def mel(f):
        return 1127.0 * np.log(1.0 + f / 700.0)

    edges = np.linspace(mel(low_freq), mel(sr / 2), num_mel_bins + 2)
    fft_mel = mel(np.arange(n_fft // 2) * sr / n_fft)
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    banks = np.maximum(0.0, np.minimum((fft_mel - left) / (centre - left), (right - fft_mel) / (right - centre)))
    return np.log(np.maximum(power[:, : n_fft // 2] @ banks.T, np.finfo(np.float32).eps))


def reference_fbank(path) -> torch.Tensor:
    """AST's recipe: the stdlib reader, torchaudio's resampler to 16 kHz (the one library step shared with
    mmte), the mean removed, then :func:`kaldi_fbank_numpy` (128 mel bins, 25/10 ms)."""
    w, sr = read_wav_stdlib(path)
    w = torchaudio.functional.resample(w, sr, 16000)
    return torch.from_numpy(kaldi_fbank_numpy((w - w.mean()).double().numpy())).float()


@pytest.fixture
def fsdd(shared_data):
    from tests.conftest import need_data

    return need_data(shared_data / "fsdd" / "recordings", "FSDD recordings")


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
    # float32 (torchaudio) vs float64 (numpy): <= 1e-3 on the faintest bins (log energy ~ -16); a wrong window,
    # pre-emphasis, DC removal or mel range is off by > 5
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=2e-3)
    normed = preprocess_audio(path)
    torch.testing.assert_close(normed, (ref - AUDIOSET_MEAN) / (2 * AUDIOSET_STD), rtol=1e-4, atol=2e-3)


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


def test_trim_silence_cuts_quiet_ends_only():
    """A tone with 0.2 s of near-silence (-70 dB) before and 0.3 s after: trimming at 35 dB keeps the tone
    to within a frame at each end; a quiet dip inside the tone is kept."""
    from mmte.data.audio import trim_silence

    sr = 8000
    g = torch.Generator().manual_seed(0)
    t = torch.arange(int(0.5 * sr)) / sr
    tone = 0.3 * torch.sin(2 * torch.pi * 300 * t)
    tone[1600:2000] *= 1e-4  # an 80 dB dip in the middle: inside the word, kept
    quiet = lambda n: 1e-4 * torch.randn(n, generator=g)
    w = torch.cat([quiet(int(0.2 * sr)), tone, quiet(int(0.3 * sr))]).float()
    out = trim_silence(w, sr, 35.0)
    start = int(0.2 * sr)
    # frame-wise: a 25 ms window (200 samples at 8 kHz) that touches the tone counts as loud, at either end
    assert tone.shape[0] <= out.shape[0] <= tone.shape[0] + 2 * 200
    # the kept samples are the tone's: find where they sit in the clip
    offset = (w.unfold(0, out.shape[0], 1) - out).abs().sum(1).argmin().item()
    assert start - 200 <= offset <= start
    torch.testing.assert_close(trim_silence(tone.float(), sr, 100.0), tone.float())  # nothing below -100 dB: whole
    frames = compute_fbank(w, sr, target_rate=8000, num_mel_bins=24, trim_db=35.0).shape[0]
    assert frames == compute_fbank(out, sr, target_rate=8000, num_mel_bins=24).shape[0] < compute_fbank(w, sr, target_rate=8000, num_mel_bins=24).shape[0]
    # a DC offset (the whole clip 0.1 off zero, as in some FSDD files) is not sound: the same cut
    torch.testing.assert_close(trim_silence(w + 0.1, sr, 35.0), out + 0.1)
    assert trim_silence(w, sr, np.float32(35.0)).shape == out.shape  # a numpy number is a number
    for bad in (0, -3, "35", True, float("nan")):
        with pytest.raises(ValueError, match="top_db \\(the preprocess option trim_db\\) must be a positive number"):
            trim_silence(w, sr, bad)


def test_trim_silence_on_a_real_recording(fsdd):
    """FSDD's jackson says "six" with ~0.18 s of quiet tail: trimmed, the fbank is shorter; the augmented
    training path trims the same recording before adding noise."""
    from mmte.data.augment import AudioAugment

    path = str(fsdd / "6_jackson_0.wav")
    full = preprocess_audio(path, target_rate=8000, num_mel_bins=64)
    trimmed = preprocess_audio(path, target_rate=8000, num_mel_bins=64, trim_db=35.0)
    assert trimmed.shape[0] < full.shape[0]
    aug = AudioAugment.from_config({"noise_snr_db": [20, 20]})
    noisy = aug.fbank(path, target_rate=8000, num_mel_bins=64, trim_db=35.0)
    assert noisy.shape[0] == trimmed.shape[0]


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_cached_resampler_equals_torchaudio_resample_to_the_bit(rate):
    """compute_fbank resamples with a resampler made once per pair of rates; it must give what
    torchaudio.functional.resample (which rebuilds the filter every call) gives, exactly."""
    w = torch.randn(rate // 3, generator=torch.Generator().manual_seed(rate))
    assert torch.equal(resampler(rate, 16000)(w), torchaudio.functional.resample(w, rate, 16000))
    assert resampler(rate, 16000) is resampler(rate, 16000)
    fb = compute_fbank(w, rate, num_mel_bins=32, frontend="speech_embedding")
    ref = compute_fbank(torchaudio.functional.resample(w, rate, 16000), 16000, num_mel_bins=32, frontend="speech_embedding")
    assert torch.equal(fb, ref)
