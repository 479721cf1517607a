"""Audio preprocessing: WAV/FLAC -> mono float waveform -> resample -> Kaldi log-mel fbank (AST-style).

The fbank is torchaudio's Kaldi-compatible filterbank (``torchaudio.compliance.kaldi.fbank``) with
the Audio Spectrogram Transformer's settings: 128 mel bins, 25 ms Hanning windows every 10 ms, HTK
mel scale, no energy term, no dither, the waveform's mean removed first; then normalised as
``(fbank - mean) / (2 * std)`` with AudioSet's statistics (-4.2677, 4.5690) unless told otherwise.
Files are read with ``soundfile`` (``torchaudio.load`` needs FFmpeg libraries).

``frontend: speech_embedding`` computes instead the log-mel that Google's pretrained speech embedding
(:mod:`mmte.tokenizers.speech_embedding`) was trained on: 16 kHz, 400-sample periodic Hann windows in
a 512-point FFT every 160 samples (no edge padding), the power spectrum on a 16-bit PCM scale, 32
Slaney mel bands from 60 to 3800 Hz (so 8 kHz telephone-band recordings lose nothing), in dB, floored
80 dB below the clip's loudest value, then ``dB / 10 + 2``. It has its own fixed scale: no mean/std.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from collections.abc import Sequence

import numpy as np
import torch

from .collate import pad_stack

__all__ = [
    "AUDIOSET_MEAN",
    "AUDIOSET_STD",
    "FRONTENDS",
    "check_waveform",
    "collate_audio",
    "compute_fbank",
    "crop_frames",
    "example_audio",
    "fbank_frames",
    "load_audio",
    "pad_or_crop",
    "preprocess_audio",
    "resampler",
    "speech_mel",
    "speech_scale",
    "trim_silence",
]

AUDIOSET_MEAN = -4.2677393
AUDIOSET_STD = 4.5689974
FRONTENDS = ("kaldi", "speech_embedding")
SPEECH_RATE, SPEECH_BINS = 16000, 32  # the speech-embedding front end's sample rate and mel bands


def load_audio(path: str | os.PathLike) -> tuple[torch.Tensor, int]:
    """Read an audio file with soundfile -> (mono float32 waveform ``[T]`` in [-1, 1], sample rate)."""
    import soundfile as sf

    data, sr = sf.read(os.fspath(path), dtype="float32", always_2d=True)
    w = torch.from_numpy(np.ascontiguousarray(data.mean(1)))
    check_waveform(w, f"audio file {os.fspath(path)}")
    return w, int(sr)


def check_waveform(waveform: torch.Tensor, what: str = "waveform") -> torch.Tensor:
    """Validate a 1-D finite waveform; returns it as float32.

    Raises:
        ValueError: naming the shape, or the index and value of the first non-finite sample.
    """
    if not isinstance(waveform, torch.Tensor):
        waveform = torch.as_tensor(np.asarray(waveform))
    if waveform.dim() != 1:
        raise ValueError(f"{what} must be mono [T]; got shape {tuple(waveform.shape)} (average channels first)")
    if not waveform.is_floating_point():
        raise ValueError(f"{what} must be floating point in [-1, 1]; got dtype {waveform.dtype}")
    bad = ~torch.isfinite(waveform)
    if bool(bad.any()):
        from ..errors import NonFiniteError

        i = int(bad.nonzero()[0, 0])
        raise NonFiniteError(f"{what} has a non-finite sample ({float(waveform[i])}) at index {i} of {waveform.shape[0]} "
                             f"({int(bad.sum())} in all)", "expected finite samples", "replace or drop the file")
    return waveform.float()


def trim_silence(waveform: torch.Tensor, sample_rate: int, top_db: float, frame_length: float = 25.0, frame_shift: float = 10.0) -> torch.Tensor:
    """Cut the leading and trailing stretches of ``waveform [T]`` whose frames are more than ``top_db``
    below the loudest frame (frame power ``10 log10(mean((x - mean x)^2))`` over ``frame_length`` ms windows every
    ``frame_shift`` ms, about the frame's own mean so that a DC offset does not count as sound: some FSDD
    files sit up to 15% of their peak off zero); the middle is kept whole. Speakers differ in how much near-silence their
    recordings carry around a word (in FSDD one speaker's "six" ends in ~0.18 s of it on average, the
    others' in 0-0.05 s), which a model can mistake for the word's length.

    Raises:
        ValueError: ``top_db`` not positive.
    """
    if isinstance(top_db, bool) or not isinstance(top_db, numbers.Real) or not top_db > 0:
        raise ValueError(f"top_db (the preprocess option trim_db) must be a positive number of decibels (e.g. 35); got {top_db!r}")
    w = check_waveform(waveform)
    win, hop = max(1, int(sample_rate * frame_length / 1000)), max(1, int(sample_rate * frame_shift / 1000))
    if w.shape[0] <= win:
        return w
    power = w.unfold(0, win, hop).var(1, unbiased=False)
    db = 10 * torch.log10(power + 1e-10)
    keep = (db > db.max() - top_db).nonzero().flatten()
    first, last = int(keep[0]), int(keep[-1])
    end = w.shape[0] if last == power.shape[0] - 1 else last * hop + win  # a loud last frame keeps the samples past it
    return w[first * hop: end]


@functools.lru_cache(maxsize=16)
def resampler(orig_rate: int, new_rate: int) -> torch.nn.Module:
    """torchaudio's resampler from ``orig_rate`` to ``new_rate`` Hz (``transforms.Resample``: the same windowed-sinc
    filter and result as ``torchaudio.functional.resample``), made once per pair of rates: the filter's kernel is
    computed when it is made, not for every clip (a tenth of a millisecond a clip, a sixth of a served WAV's
    preprocessing)."""
    import torchaudio

    return torchaudio.transforms.Resample(orig_rate, new_rate, dtype=torch.float32)


def compute_fbank(
    waveform: torch.Tensor,
    sample_rate: int,
    target_rate: int = 16000,
    num_mel_bins: int = 128,
    frame_length: float = 25.0,
    frame_shift: float = 10.0,
    mean: float | None = AUDIOSET_MEAN,
    std: float | None = AUDIOSET_STD,
    trim_db: float | None = None,
    vtln_warp: float = 1.0,
    frontend: str = "kaldi",
    scaled: bool = True,
) -> torch.Tensor:
    """Waveform ``[T]`` -> log-mel fbank ``[frames, num_mel_bins]`` at ``target_rate``.

    Resamples with torchaudio's windowed-sinc resampler (:func:`resampler`) when ``sample_rate != target_rate``.
    ``mean``/``std`` None: no normalisation. ``trim_db``: first cut leading/trailing near-silence
    (:func:`trim_silence`; None: keep the clip whole). ``vtln_warp``: a frequency-warp factor of the
    mel filterbank (Kaldi's piecewise-linear VTLN warp between 100 Hz and 500 Hz below Nyquist; 1.0:
    none), as a vocal-tract-length perturbation draws per training clip
    (:class:`mmte.data.augment.WaveformAugment`'s ``vtlp``).

    ``frontend: speech_embedding``: the pretrained speech embedding's log-mel (:func:`speech_mel`;
    ``target_rate`` must be 16000 and ``num_mel_bins`` 32, the frame settings and ``mean``/``std`` are
    its own); ``scaled=False`` returns it before :func:`speech_scale` (the natural-log power that
    augmentation works on).
    """
    import torchaudio

    if frontend not in FRONTENDS:
        raise ValueError(f"audio frontend must be one of {FRONTENDS}; got {frontend!r}")
    w = check_waveform(waveform)
    if not isinstance(sample_rate, int) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive int; got {sample_rate!r}")
    if trim_db is not None:
        w = trim_silence(w, sample_rate, trim_db, frame_length, frame_shift)
    if not isinstance(vtln_warp, (int, float)) or not 0.5 <= float(vtln_warp) <= 2.0:
        raise ValueError(f"vtln_warp must be a number in [0.5, 2.0] (1.0: no warp); got {vtln_warp!r}")
    if frontend == "speech_embedding":
        _check_speech_options(target_rate, num_mel_bins, frame_length, frame_shift, mean, std, vtln_warp)
    if sample_rate != target_rate:
        w = resampler(sample_rate, target_rate)(w)
    if frontend == "speech_embedding":
        mel = speech_mel(w)
        return speech_scale(mel) if scaled else mel
    min_len = int(target_rate * frame_length / 1000)
    if w.shape[0] < min_len:
        raise ValueError(f"waveform has {w.shape[0]} samples at {target_rate} Hz; at least one {frame_length} ms frame ({min_len}) expected")
    fb = torchaudio.compliance.kaldi.fbank(
        (w - w.mean())[None],
        htk_compat=True,
        sample_frequency=target_rate,
        use_energy=False,
        window_type="hanning",
        num_mel_bins=num_mel_bins,
        dither=0.0,
        frame_length=frame_length,
        frame_shift=frame_shift,
        vtln_warp=float(vtln_warp),
    )
    if mean is not None and std is not None:
        fb = (fb - mean) / (2 * std)
    return fb


def _check_speech_options(target_rate, num_mel_bins, frame_length, frame_shift, mean, std, vtln_warp) -> None:
    got = {"target_rate": target_rate, "num_mel_bins": num_mel_bins, "frame_length": frame_length, "frame_shift": frame_shift}
    want = {"target_rate": SPEECH_RATE, "num_mel_bins": SPEECH_BINS, "frame_length": 25.0, "frame_shift": 10.0}
    bad = {k: v for k, v in got.items() if v != want[k]}
    if bad:
        raise ValueError(f"frontend speech_embedding is fixed at {want} (what the pretrained network was trained on); got {bad}")
    if (mean, std) not in ((AUDIOSET_MEAN, AUDIOSET_STD), (None, None)):
        raise ValueError(f"frontend speech_embedding has its own fixed scale (dB / 10 + 2); mean/std must be left unset; got {mean}, {std}")
    if float(vtln_warp) != 1.0:
        raise ValueError(f"frontend speech_embedding does not warp its mel bands (vtln_warp / augment vtlp); got {vtln_warp}")


@functools.lru_cache(maxsize=1)
def _speech_bank() -> tuple[torch.Tensor, torch.Tensor]:
    """The speech front end's analysis window and mel bank, built once (it runs per clip per epoch)."""
    import torchaudio

    bank = torchaudio.functional.melscale_fbanks(257, 60.0, 3800.0, SPEECH_BINS, SPEECH_RATE, norm="slaney", mel_scale="slaney")
    return torch.hann_window(400), bank


def speech_mel(waveform: torch.Tensor) -> torch.Tensor:
    """A 16 kHz waveform ``[S]`` in [-1, 1] -> natural-log mel power ``[frames, 32]`` on a 16-bit PCM scale:
    the speech embedding's spectrogram before :func:`speech_scale` (``frames = 1 + (S - 512) // 160``).

    Raises:
        ValueError: shorter than one 512-sample FFT window.
    """
    w = check_waveform(waveform) * 32768.0
    if w.shape[0] < 512:
        raise ValueError(f"waveform has {w.shape[0]} samples at 16 kHz; the speech_embedding front end needs at least 512 (32 ms)")
    window, bank = _speech_bank()
    spec = torch.stft(w, n_fft=512, hop_length=160, win_length=400, window=window, center=False, return_complex=True)
    power = spec.abs().square().T  # [frames, 257]
    return (power @ bank).clamp_min(1e-10).log()


def speech_scale(mel: torch.Tensor, top_db: float = 80.0) -> torch.Tensor:
    """Natural-log mel power ``[frames, F]`` (:func:`speech_mel`) -> the speech embedding's input scale:
    dB floored ``top_db`` below the clip's loudest value, then ``dB / 10 + 2``."""
    db = mel * (10.0 / math.log(10.0))
    return torch.maximum(db, db.max() - top_db) / 10.0 + 2.0


def pad_or_crop(fbank: torch.Tensor, min_frames: int | None = None, max_frames: int | None = None, value: float = 0.0) -> torch.Tensor:
    """Crop an fbank ``[frames, mel]`` to ``max_frames`` (keeping the start) and pad it with ``value``
    to ``min_frames`` (e.g. the tokenizer's patch size for very short clips)."""
    if max_frames is not None and fbank.shape[0] > max_frames:
        fbank = fbank[:max_frames]
    if min_frames is not None and fbank.shape[0] < min_frames:
        fbank = torch.cat([fbank, fbank.new_full((min_frames - fbank.shape[0], fbank.shape[1]), value)])
    return fbank


def preprocess_audio(source, sample_rate: int | None = None, **fbank_kwargs) -> torch.Tensor:
    """A file path, or a waveform with its ``sample_rate`` -> normalised fbank ``[frames, mel]``."""
    if isinstance(source, (str, os.PathLike)):
        source, sample_rate = load_audio(source)
    if sample_rate is None:
        raise ValueError("preprocess_audio needs sample_rate when given a waveform")
    return compute_fbank(source, sample_rate, **fbank_kwargs)


def collate_audio(samples: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pad fbanks ``[frames_i, mel]`` -> ``{"fbank": [B, frames, mel], "frames": [B]}``."""
    for i, s in enumerate(samples):
        if not isinstance(s, torch.Tensor) or s.dim() != 2:
            raise ValueError(f"audio sample {i} must be an fbank [frames, mel]; got {getattr(s, 'shape', type(s))}")
    fbank, frames = pad_stack(samples, 0, 0.0)
    return {"fbank": fbank, "frames": frames}


def example_audio(size: int, seed: int, num_mel_bins: int = 128) -> torch.Tensor:
    """Fbank of a synthetic voiced sound (a gliding harmonic series with formant-like amplitudes and
    a little noise), 0.4 s (size 0) or 1.0 s (size 1) at 16 kHz."""
    g = torch.Generator().manual_seed(seed)
    sr, dur = 16000, (0.4, 1.0)[size]
    t = torch.arange(int(sr * dur)) / sr
    f0 = 110 + 90 * torch.rand((), generator=g)
    phase = 2 * math.pi * torch.cumsum(f0 * (1 + 0.2 * t) * torch.ones_like(t), 0) / sr
    w = sum(math.exp(-((k * 150 - 700) / 600) ** 2) * torch.sin(k * phase) for k in range(1, 12))
    w = 0.3 * w * torch.hann_window(t.shape[0], periodic=False) + 0.003 * torch.randn(t.shape, generator=g)
    return compute_fbank(w.float(), sr, num_mel_bins=num_mel_bins)


def fbank_frames(num_samples: int, sample_rate: int, target_rate: int = 16000, frame_length: float = 25.0, frame_shift: float = 10.0) -> int:
    """Frames :func:`compute_fbank` gives a clip of ``num_samples`` at ``sample_rate`` (Kaldi's
    ``snip_edges``: whole windows only), without decoding it: for reporting crops from file headers."""
    n = math.ceil(num_samples * target_rate / sample_rate) if sample_rate != target_rate else num_samples
    win, shift = int(target_rate * frame_length / 1000), int(target_rate * frame_shift / 1000)
    return 0 if n < win else 1 + (n - win) // shift


CROPS = ("start", "center", "random")


def crop_frames(fbank: torch.Tensor, max_frames: int | None, mode: str = "start", generator: torch.Generator | None = None) -> torch.Tensor:
    """Keep at most ``max_frames`` frames of an fbank ``[frames, mel]``: the first ones (``start``), the
    middle ones (``center``) or a window at a random offset (``random``, drawn from ``generator`` or
    torch's global RNG)."""
    if mode not in CROPS:
        raise ValueError(f"crop must be one of {CROPS}; got {mode!r}")
    t = fbank.shape[0]
    if max_frames is None or t <= max_frames:
        return fbank
    extra = t - max_frames
    if mode == "start":
        off = 0
    elif mode == "center":
        off = extra // 2
    else:
        off = int(torch.randint(0, extra + 1, (), generator=generator))
    return fbank[off : off + max_frames]
