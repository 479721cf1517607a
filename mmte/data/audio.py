"""Audio preprocessing: WAV/FLAC -> mono float waveform -> resample -> Kaldi log-mel fbank (AST-style).

The fbank is torchaudio's Kaldi-compatible filterbank (``torchaudio.compliance.kaldi.fbank``) with
the Audio Spectrogram Transformer's settings: 128 mel bins, 25 ms Hanning windows every 10 ms, HTK
mel scale, no energy term, no dither, the waveform's mean removed first; then normalised as
``(fbank - mean) / (2 * std)`` with AudioSet's statistics (-4.2677, 4.5690) unless told otherwise.
Files are read with ``soundfile`` (``torchaudio.load`` needs FFmpeg libraries).
"""

from __future__ import annotations

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
    "check_waveform",
    "collate_audio",
    "compute_fbank",
    "crop_frames",
    "example_audio",
    "fbank_frames",
    "load_audio",
    "pad_or_crop",
    "preprocess_audio",
    "trim_silence",
]

AUDIOSET_MEAN = -4.2677393
AUDIOSET_STD = 4.5689974


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
) -> torch.Tensor:
    """Waveform ``[T]`` -> log-mel fbank ``[frames, num_mel_bins]`` at ``target_rate``.

    Resamples with ``torchaudio.functional.resample`` when ``sample_rate != target_rate``.
    ``mean``/``std`` None: no normalisation. ``trim_db``: first cut leading/trailing near-silence
    (:func:`trim_silence`; None: keep the clip whole). ``vtln_warp``: a frequency-warp factor of the
    mel filterbank (Kaldi's piecewise-linear VTLN warp between 100 Hz and 500 Hz below Nyquist; 1.0:
    none), as a vocal-tract-length perturbation draws per training clip
    (:class:`mmte.data.augment.WaveformAugment`'s ``vtlp``).
    """
    import torchaudio

    w = check_waveform(waveform)
    if not isinstance(sample_rate, int) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive int; got {sample_rate!r}")
    if trim_db is not None:
        w = trim_silence(w, sample_rate, trim_db, frame_length, frame_shift)
    if not isinstance(vtln_warp, (int, float)) or not 0.5 <= float(vtln_warp) <= 2.0:
        raise ValueError(f"vtln_warp must be a number in [0.5, 2.0] (1.0: no warp); got {vtln_warp!r}")
    if sample_rate != target_rate:
        w = torchaudio.functional.resample(w, sample_rate, target_rate)
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
