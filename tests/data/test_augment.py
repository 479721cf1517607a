"""Audio augmentation (mmte.data.augment) against independent computations: torchaudio's resampler,
the dB definitions of gain and SNR, explicit mask counting, and the equaliser's cosine series."""

from __future__ import annotations

import math

import pytest
import torch
import torchaudio

from mmte.data.augment import AudioAugment, SpecAugment, WaveformAugment, utterance_cmvn


def _wave(n: int = 8000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / 8000
    return (0.3 * torch.sin(2 * math.pi * 220 * t) + 0.01 * torch.randn(n, generator=g)).float()


def test_speed_resamples_like_torchaudio():
    w = _wave()
    aug = WaveformAugment(speed=[1.1, 1.1], speed_steps=1)
    out = aug(w, 8000)
    ref = torchaudio.functional.resample(w, 8800, 8000)  # 1.1x faster: read at 8.8 kHz, play at 8 kHz
    assert out.shape == (math.ceil(8000 * 8000 / 8800),)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # independently of the resampler: the 220 Hz tone now plays at 1.1 x 220 = 242 Hz (spectral peak, 1.1 Hz bins)
    spec = torch.fft.rfft(out.double() * torch.hann_window(out.shape[0], dtype=torch.float64)).abs()
    peak_hz = float(spec.argmax()) * 8000 / out.shape[0]
    assert abs(peak_hz - 242.0) < 1.5, peak_hz
    torch.manual_seed(0)
    lengths = {WaveformAugment(speed=[0.9, 1.1], speed_steps=3)(w, 8000).shape[0] for _ in range(40)}
    assert lengths == {math.ceil(8000 * 8000 / 7200), 8000, math.ceil(8000 * 8000 / 8800)}


def test_gain_and_noise_follow_their_db_definitions():
    w = _wave()
    out = WaveformAugment(gain_db=[6.0, 6.0])(w, 8000)
    torch.testing.assert_close(out, w * 10 ** (6 / 20), rtol=1e-6, atol=0)
    torch.manual_seed(1)
    noisy = WaveformAugment(noise_snr_db=[20.0, 20.0])(w, 8000)
    snr = 10 * math.log10(float(w.pow(2).mean()) / float((noisy - w).pow(2).mean()))
    assert abs(snr - 20.0) < 0.3, snr  # white noise of the requested power (8000 samples: +-0.3 dB)
    with pytest.raises(ValueError) as e:
        WaveformAugment(noise_snr_db=[30, 10])
    assert str(e.value) == "augment noise_snr_db must be a [low, high] range with low <= high; got [30, 10]"


def test_shift_moves_the_clip_and_keeps_its_length():
    w = _wave(800)
    torch.manual_seed(3)
    for _ in range(10):
        out = WaveformAugment(shift=0.2)(w, 8000)
        assert out.shape == w.shape
        n = int((out == 0).sum())  # the inserted zeros (the sine never hits exactly 0 after noise)
        if n and out[0] == 0:
            torch.testing.assert_close(out[n:], w[: 800 - n], rtol=0, atol=0)
        elif n:
            torch.testing.assert_close(out[: 800 - n], w[n:], rtol=0, atol=0)
        assert n <= 0.2 * 800


def test_spec_masks_count_and_fill():
    torch.manual_seed(0)
    fb = torch.randn(50, 64) + 3.0
    for _ in range(20):
        out = SpecAugment(freq_masks=1, freq_width=8, time_masks=1, time_width=30, time_ratio=0.2)(fb)
        changed = out != fb
        cols = changed.all(0).sum()  # masked mel bins: every frame changed
        rows = changed.all(1).sum()  # masked frames
        assert cols <= 8 and rows <= 10  # time_ratio 0.2 of 50 frames caps the time mask at 10
        assert torch.allclose(out[changed], torch.full_like(out[changed], float(fb.mean())))


def test_equaliser_is_a_smooth_per_bin_gain():
    torch.manual_seed(0)
    fb = torch.randn(30, 40)
    out = SpecAugment(freq_masks=0, time_masks=0, eq_db=12.0, eq_bands=3)(fb)
    diff = out - fb
    torch.testing.assert_close(diff, diff[:1].expand_as(diff), rtol=0, atol=1e-6)  # the same gain in every frame
    db = diff[0] * 10 / math.log(10)
    assert float(db.abs().max()) <= 12.0 + 1e-4
    # independent: least squares on the 3 cosine basis functions recovers the curve exactly
    f = torch.arange(40, dtype=torch.float64)
    basis = torch.stack([torch.cos(math.pi * k * (f + 0.5) / 40) for k in (1, 2, 3)], 1)
    coef = torch.linalg.lstsq(basis, db.double()[:, None]).solution
    torch.testing.assert_close((basis @ coef)[:, 0], db.double(), rtol=0, atol=1e-4)
    assert float(coef.abs().max()) <= 4.0 + 1e-4  # |a_k| <= eq_db / eq_bands


def test_tempo_stretches_frames_in_time_only():
    import numpy as np

    torch.manual_seed(0)
    fb = torch.randn(60, 16)
    aug = SpecAugment(freq_masks=0, time_masks=0, tempo=[0.7, 1.4])
    lengths = set()
    for _ in range(40):
        out = aug(fb)
        n = out.shape[0]
        lengths.add(n)
        assert out.shape[1] == 16 and round(60 / 1.4) <= n <= round(60 / 0.7)
        # independent: per mel bin, numpy's linear interpolation of the frames at n evenly spaced times
        pos = np.linspace(0, 59, n)
        ref = np.stack([np.interp(pos, np.arange(60), fb[:, f].numpy()) for f in range(16)], 1)
        torch.testing.assert_close(out, torch.from_numpy(ref).float(), rtol=0, atol=1e-4)
    assert min(lengths) < 50 and max(lengths) > 72  # both slower and faster draws over 40 clips
    # a steady sound keeps its spectrum (no pitch or formant change), only its duration moves
    steady = torch.linspace(-2, 2, 16).expand(60, 16)
    out = aug(steady)
    torch.testing.assert_close(out, steady[:1].expand(out.shape[0], 16), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"augment tempo must be a \[low, high\] range .*got \[1.2, 0.8\]"):
        SpecAugment(tempo=[1.2, 0.8])
    with pytest.raises(ValueError, match=r"augment tempo must lie in \[0.25, 4.0\]; got \[0.5, 5\]"):
        SpecAugment(tempo=[0.5, 5])
    assert SpecAugment(freq_masks=0, time_masks=0).stretch(fb) is fb  # off: nothing drawn, nothing changed


def test_utterance_cmvn():
    fb = torch.randn(40, 16) * torch.linspace(0.5, 3, 16) + torch.linspace(-4, 4, 16)
    out = utterance_cmvn(fb)
    torch.testing.assert_close(out.mean(0), torch.zeros(16), rtol=0, atol=1e-5)
    torch.testing.assert_close(out.std(0, unbiased=False), torch.ones(16), rtol=0, atol=1e-4)


def test_from_config_and_reproducibility(tmp_path):
    assert AudioAugment.from_config(None) is None and AudioAugment.from_config({}) is None
    with pytest.raises(ValueError) as e:
        AudioAugment.from_config({"speed": [0.9, 1.1], "pitch": 2})
    assert str(e.value).startswith("unknown augment option(s) ['pitch']; expected some of ['eq_bands', 'eq_db', 'freq_masks'")
    import soundfile as sf

    sf.write(tmp_path / "a.wav", _wave().numpy(), 8000)
    aug = AudioAugment.from_config({"speed": [0.9, 1.1], "shift": 0.1, "gain_db": 6, "noise_snr_db": [10, 40], "freq_masks": 2,
                                    "freq_width": 8, "time_masks": 2, "time_width": 10, "eq_db": 6})
    torch.manual_seed(7)
    a = aug.fbank(str(tmp_path / "a.wav"), target_rate=8000, num_mel_bins=32)
    torch.manual_seed(7)
    b = aug.fbank(str(tmp_path / "a.wav"), target_rate=8000, num_mel_bins=32)
    c = aug.fbank(str(tmp_path / "a.wav"), target_rate=8000, num_mel_bins=32)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert a.shape[1] == 32 and not (a.shape == c.shape and torch.equal(a, c))


def test_no_op_augment_equals_plain_preprocessing(tmp_path):
    """With every perturbation off the augmented path is the plain one, normalisation included (the
    equaliser works on the natural-log scale before the fbank's mean/std normalisation)."""
    import soundfile as sf

    from mmte.data.audio import preprocess_audio

    sf.write(tmp_path / "a.wav", _wave().numpy(), 8000)
    aug = AudioAugment.from_config({"p": 0.0})
    for kw in ({}, {"mean": None, "std": None}, {"mean": -3.0, "std": 2.0}):
        ref = preprocess_audio(str(tmp_path / "a.wav"), target_rate=8000, num_mel_bins=24, **kw)
        torch.testing.assert_close(aug.fbank(str(tmp_path / "a.wav"), target_rate=8000, num_mel_bins=24, **kw), ref, rtol=0, atol=0)


def _centroid_bin(fb: torch.Tensor) -> float:
    power = fb.exp().mean(0)  # Kaldi's fbank is the natural log of the mel band power
    return float((power * torch.arange(power.shape[0])).sum() / power.sum())


def test_vtlp_warps_the_filterbank_like_a_scaled_spectrum():
    """A warp factor a moves a tone's energy to the mel bins of a tone a times higher (Kaldi's VTLN warp
    is linear between 100 Hz and 500 Hz below Nyquist): checked against unwarped tones, not the warp code."""
    from mmte.data.audio import compute_fbank

    t = torch.arange(8000) / 8000

    def tone(hz: float) -> torch.Tensor:
        return (0.3 * torch.sin(2 * math.pi * hz * t)).float()

    kw = {"target_rate": 8000, "num_mel_bins": 64, "mean": None, "std": None}
    base = _centroid_bin(compute_fbank(tone(1000.0), 8000, **kw))
    for a in (0.9, 1.1):
        warped = _centroid_bin(compute_fbank(tone(1000.0), 8000, vtln_warp=a, **kw))
        scaled = _centroid_bin(compute_fbank(tone(1000.0 * a), 8000, **kw))
        assert abs(warped - scaled) < 0.3, (a, warped, scaled)
        assert abs(warped - base) > 1.5, (a, warped, base)  # ~50 Hz per bin near 1 kHz: a 100 Hz move is ~2 bins
    with pytest.raises(ValueError) as e:
        compute_fbank(tone(1000.0), 8000, vtln_warp=3.0)
    assert str(e.value) == "vtln_warp must be a number in [0.5, 2.0] (1.0: no warp); got 3.0"


def test_vtlp_draws_a_warp_per_clip(tmp_path, monkeypatch):
    import soundfile as sf

    from mmte.data import audio

    with pytest.raises(ValueError) as e:
        WaveformAugment(vtlp=[0.9, 2.5])
    assert str(e.value) == "augment vtlp must lie in [0.5, 2.0]; got [0.9, 2.5]"
    assert WaveformAugment().warp() == 1.0 and not WaveformAugment().active and WaveformAugment(vtlp=[0.9, 1.1]).active
    sf.write(tmp_path / "a.wav", _wave().numpy(), 8000)
    seen = []
    real = audio.compute_fbank
    monkeypatch.setattr(audio, "compute_fbank", lambda *a, **k: (seen.append(k["vtln_warp"]), real(*a, **k))[1])
    aug = AudioAugment.from_config({"vtlp": [0.9, 1.1]})
    torch.manual_seed(0)
    fbs = [aug.fbank(str(tmp_path / "a.wav"), target_rate=8000, num_mel_bins=32) for _ in range(20)]
    assert all(0.9 <= w <= 1.1 for w in seen) and len(set(seen)) == 20 and max(seen) - min(seen) > 0.1
    w, sr = audio.load_audio(tmp_path / "a.wav")
    torch.testing.assert_close(fbs[3], real(w, sr, target_rate=8000, num_mel_bins=32, vtln_warp=seen[3]), rtol=0, atol=0)
    seen.clear()  # with p = 0 no clip is warped; a fixed preprocessing warp passes through
    AudioAugment.from_config({"vtlp": [0.9, 1.1], "p": 0.0}).fbank(str(tmp_path / "a.wav"), target_rate=8000, num_mel_bins=32, vtln_warp=1.05)
    assert seen == [1.05]
