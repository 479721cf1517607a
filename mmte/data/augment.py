"""Audio augmentation for training: waveform perturbations and SpecAugment-style masks.

Models trained on a handful of speakers learn the speakers; these perturbations make the training
clips vary in the ways a new speaker or microphone differs, so the model has to learn the words:

* :class:`WaveformAugment` on a mono waveform ``[S]``: speed perturbation (resampling by a random
  factor, which moves pitch and formants together, as Kaldi's 0.9/1.0/1.1 recipe), a random time
  shift (zero padding at the start or end), a random gain (dB) and additive white noise at a random
  signal-to-noise ratio; and a vocal-tract-length perturbation (``vtlp``: the mel filterbank's
  frequencies warped by a random factor, moving the formants but not the pitch or the tempo; Jaitly &
  Hinton 2013), applied when :class:`AudioAugment` computes the fbank.
* :class:`SpecAugment` on a log-mel fbank ``[T, F]``: a tempo change (``tempo``: the frames
  stretched or squeezed in time by a random factor, so the word is said faster or slower while pitch
  and formants stay put, unlike ``speed``), then frequency and time masks
  (``torchaudio.transforms.FrequencyMasking`` / ``TimeMasking``; Park et al. 2019), filled with the
  clip's mean so a later per-utterance normalisation sees no artificial outliers.
* :func:`utterance_cmvn`: per-utterance mean/variance normalisation of one fbank ``[T, F]`` (each
  mel bin standardised over the clip's frames), the single-clip form of the audio tokenizer's
  ``normalize: utterance``.

Both augmenters draw from torch's global RNG, which Lightning seeds (``seed_everything``) and
:class:`mmte.training.MMTEModule` re-seeds each epoch (``epoch_seed``), so runs repeat exactly with
``num_workers: 0``. They are applied to the training split only
(:class:`mmte.training.data.FolderDataModule`'s ``augment``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["AudioAugment", "SpecAugment", "WaveformAugment", "utterance_cmvn"]


def _range(v: Any, what: str, lo: float = -math.inf, symmetric: bool = False, hi: float = math.inf) -> tuple[float, float] | None:
    """``[low, high]`` -> a checked tuple; a single number ``g`` -> ``(-g, g)`` when ``symmetric``.
    With a finite ``hi`` the range must also lie in ``[lo, hi]``."""
    if v is None:
        return None
    if symmetric and isinstance(v, (int, float)) and v >= 0:
        return -float(v), float(v)
    t = tuple(float(x) for x in v) if isinstance(v, (list, tuple)) else None
    if t is None or len(t) != 2 or t[0] > t[1] or t[0] < lo:
        raise ValueError(f"augment {what} must be a [low, high] range with low <= high{f' (low >= {lo})' if lo > -math.inf else ''}; got {v!r}")
    if t[1] > hi:
        raise ValueError(f"augment {what} must lie in [{lo}, {hi}]; got {v!r}")
    return t


@dataclass
class WaveformAugment:
    """Random perturbations of a mono waveform ``[S]``.

    Args:
        speed: ``[low, high]`` speed factor (e.g. ``[0.9, 1.1]``), drawn from ``speed_steps`` evenly
            spaced values; the clip is resampled so it plays that much faster (pitch moves with it);
            None: off.
        speed_steps: how many factors ``speed`` is quantised to (resampling kernels are cached per factor).
        shift: largest time shift as a fraction of the clip's length: the clip is delayed (zeros in
            front, its end cut) or advanced (its start cut, zeros at the end) by up to this; its length
            stays; 0: off.
        gain_db: ``[low, high]`` gain in dB (a number ``g``: ``[-g, g]``); None: off.
        noise_snr_db: ``[low, high]`` signal-to-noise ratio in dB of added white noise; None: off.
        vtlp: ``[low, high]`` frequency-warp factor of the mel filterbank (e.g. ``[0.9, 1.1]``), drawn
            uniformly per clip (:meth:`warp`); None: off.
        p: probability that a clip is augmented at all.
    """

    speed: list[float] | None = None
    speed_steps: int = 5
    shift: float = 0.0
    gain_db: float | list[float] | None = None
    noise_snr_db: list[float] | None = None
    vtlp: list[float] | None = None
    p: float = 1.0

    def __post_init__(self):
        self._speed = _range(self.speed, "speed", 0.5, hi=2.0)
        self._gain = _range(self.gain_db, "gain_db", symmetric=True)
        self._snr = _range(self.noise_snr_db, "noise_snr_db")
        self._vtlp = _range(self.vtlp, "vtlp", 0.5, hi=2.0)
        if not 0.0 <= float(self.shift) < 1.0:
            raise ValueError(f"augment shift must be a fraction in [0, 1); got {self.shift!r}")
        if not 0.0 <= float(self.p) <= 1.0:
            raise ValueError(f"augment p must be a probability in [0, 1]; got {self.p!r}")
        if not isinstance(self.speed_steps, int) or self.speed_steps < 1:
            raise ValueError(f"augment speed_steps must be a positive int; got {self.speed_steps!r}")

    @property
    def active(self) -> bool:
        return self.p > 0 and (self._speed is not None or self.shift > 0 or self._gain is not None or self._snr is not None or self._vtlp is not None)

    def warp(self) -> float:
        """A clip's filterbank warp factor: ``U[vtlp]``, or 1.0 when ``vtlp`` is off (no random number
        is drawn then, so runs without it repeat as before)."""
        if self._vtlp is None:
            return 1.0
        lo, hi = self._vtlp
        return lo + (hi - lo) * float(torch.rand(()))

    def __call__(self, waveform: torch.Tensor, sample_rate: int, draw: bool = True) -> torch.Tensor:
        """``[S]`` float waveform -> an augmented ``[S']`` waveform (``S'`` differs under speed changes).
        ``draw=False``: the caller has already decided (with probability ``p``) that this clip is augmented."""
        import torchaudio

        w = waveform
        if not self.active or (draw and float(torch.rand(())) >= self.p):
            return w
        if self._speed is not None:
            lo, hi = self._speed
            k = int(torch.randint(self.speed_steps, ())) if self.speed_steps > 1 else 0
            factor = lo + (hi - lo) * k / max(self.speed_steps - 1, 1) if self.speed_steps > 1 else (lo + hi) / 2
            if abs(factor - 1.0) > 1e-6:
                # play `factor` times faster: read the clip as if recorded at sr * factor, resample to sr
                src = round(sample_rate * factor / 100) * 100 or sample_rate
                w = torchaudio.functional.resample(w, src, sample_rate)
        if self.shift > 0:
            n = int(float(torch.rand(())) * self.shift * w.shape[0])
            if n:
                w = torch.cat([w.new_zeros(n), w[:-n]]) if bool(torch.rand(()) < 0.5) else torch.cat([w[n:], w.new_zeros(n)])
        if self._gain is not None:
            lo, hi = self._gain
            w = w * 10 ** ((lo + (hi - lo) * float(torch.rand(()))) / 20)
        if self._snr is not None:
            lo, hi = self._snr
            snr = lo + (hi - lo) * float(torch.rand(()))
            power = w.pow(2).mean().clamp_min(1e-10)
            w = w + torch.randn_like(w) * (power / 10 ** (snr / 10)).sqrt()
        return w


@dataclass
class SpecAugment:
    """SpecAugment-style masks on a log-mel fbank ``[T, F]`` (Park et al. 2019).

    Args:
        freq_masks: number of frequency masks.
        freq_width: largest frequency mask width (mel bins); masks are ``U[0, freq_width]`` wide.
        time_masks: number of time masks.
        time_width: largest time mask width (frames).
        time_ratio: a time mask covers at most this fraction of the clip (short clips keep most frames).
        eq_db: a random equaliser: a smooth gain curve over the mel bins, ``sum_k a_k cos(pi k f / F)``
            for ``k = 1..eq_bands`` with ``a_k ~ U(-1, 1) * eq_db / eq_bands`` dB, added to the log-mel
            fbank (a different microphone / room / voice colouring); 0: off.
        eq_bands: cosine terms of the equaliser curve (higher: wigglier curves).
        tempo: ``[low, high]`` speaking-rate factor (e.g. ``[0.7, 1.4]``; 1.25: a quarter faster, so
            ``T / 1.25`` frames), drawn log-uniformly; the frames are linearly interpolated in time,
            before the equaliser and masks. None: off.
    """

    freq_masks: int = 2
    freq_width: int = 8
    time_masks: int = 2
    time_width: int = 10
    time_ratio: float = 0.2
    eq_db: float = 0.0
    eq_bands: int = 3
    tempo: list[float] | None = None

    def __post_init__(self):
        for f in ("freq_masks", "freq_width", "time_masks", "time_width", "eq_bands"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"SpecAugment {f} must be an int >= 0; got {v!r}")
        if not 0.0 < float(self.time_ratio) <= 1.0:
            raise ValueError(f"SpecAugment time_ratio must be in (0, 1]; got {self.time_ratio!r}")
        if float(self.eq_db) < 0:
            raise ValueError(f"SpecAugment eq_db must be >= 0; got {self.eq_db!r}")
        self._tempo = _range(self.tempo, "tempo", 0.25, hi=4.0)
        self._freq = self._time = None

    @property
    def active(self) -> bool:
        return ((self.freq_masks > 0 and self.freq_width > 0) or (self.time_masks > 0 and self.time_width > 0)
                or (self.eq_db > 0 and self.eq_bands > 0) or self._tempo is not None)

    def stretch(self, fbank: torch.Tensor) -> torch.Tensor:
        """``[T, F]`` -> ``[round(T / r), F]`` for a tempo factor ``r`` drawn log-uniformly from
        ``tempo`` (the fbank unchanged, and no random number drawn, when ``tempo`` is off)."""
        if self._tempo is None:
            return fbank
        lo, hi = self._tempo
        r = math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * float(torch.rand(())))
        t = fbank.shape[0]
        n = max(1, round(t / r))
        if t < 2 or n == t:
            return fbank
        return torch.nn.functional.interpolate(fbank.t()[None], size=n, mode="linear", align_corners=True)[0].t().contiguous()

    def __call__(self, fbank: torch.Tensor) -> torch.Tensor:
        """``[T, F]`` -> ``[T, F]`` with masked bands set to the clip's mean."""
        import torchaudio

        if fbank.dim() != 2:
            raise ValueError(f"SpecAugment expects an fbank [T, F]; got shape {tuple(fbank.shape)}")
        if not self.active:
            return fbank
        fbank = self.stretch(fbank)
        if self.eq_db > 0 and self.eq_bands > 0:
            f = fbank.shape[1]
            k = torch.arange(1, self.eq_bands + 1, dtype=fbank.dtype)
            a = (torch.rand(self.eq_bands, dtype=fbank.dtype) * 2 - 1) * (self.eq_db / self.eq_bands)
            curve_db = (a[:, None] * torch.cos(math.pi * k[:, None] * (torch.arange(f, dtype=fbank.dtype) + 0.5) / f)).sum(0)
            fbank = fbank + curve_db * (math.log(10) / 10)  # dB -> natural-log power (Kaldi's fbank)
        spec = fbank.t()[None]  # [1, F, T]: torchaudio's (..., freq, time) layout
        fill = float(fbank.mean())
        if self.freq_width > 0 and self.freq_masks > 0:
            if self._freq is None:
                self._freq = torchaudio.transforms.FrequencyMasking(self.freq_width)
            self._freq.mask_param = min(self.freq_width, fbank.shape[1])
            for _ in range(self.freq_masks):
                spec = self._freq(spec, mask_value=fill)
        width = min(self.time_width, int(self.time_ratio * fbank.shape[0]))
        if width > 0 and self.time_masks > 0:
            if self._time is None:
                self._time = torchaudio.transforms.TimeMasking(self.time_width)
            self._time.mask_param = width
            for _ in range(self.time_masks):
                spec = self._time(spec, mask_value=fill)
        return spec[0].t().contiguous()


def utterance_cmvn(fbank: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Per-utterance mean/variance normalisation of one fbank ``[T, F]``: every mel bin minus its
    mean over the clip, divided by its standard deviation."""
    if fbank.dim() != 2:
        raise ValueError(f"utterance_cmvn expects an fbank [T, F]; got shape {tuple(fbank.shape)}")
    mean = fbank.mean(0, keepdim=True)
    return (fbank - mean) / (fbank.var(0, unbiased=False, keepdim=True) + eps).sqrt()


@dataclass
class AudioAugment:
    """Waveform perturbations, then fbank, then SpecAugment masks: the training-time audio pipeline.

    Built from a recipe's ``augment`` mapping (:meth:`from_config`), e.g.
    ``{speed: [0.9, 1.1], shift: 0.1, gain_db: 6, noise_snr_db: [15, 40], freq_masks: 2, freq_width: 8,
    time_masks: 2, time_width: 10}``.
    """

    waveform: WaveformAugment
    spec: SpecAugment

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> AudioAugment | None:
        """A mapping of :class:`WaveformAugment` and :class:`SpecAugment` fields -> an AudioAugment
        (None for an empty/None mapping).

        Raises:
            ValueError: an unknown key, naming the known ones.
        """
        if not config:
            return None
        if not isinstance(config, Mapping):
            raise TypeError(f"augment must be a mapping of options; got {config!r}")
        wf, sf = {f.name for f in fields(WaveformAugment)}, {f.name for f in fields(SpecAugment)}
        unknown = sorted(set(config) - wf - sf)
        if unknown:
            raise ValueError(f"unknown augment option(s) {unknown}; expected some of {sorted(wf | sf)}")
        spec_cfg = {k: v for k, v in config.items() if k in sf}
        aug = cls(WaveformAugment(**{k: v for k, v in config.items() if k in wf}), SpecAugment(**{"freq_masks": 0, "time_masks": 0, **spec_cfg}))
        logger.info("audio augmentation (training split only): %s", {k: v for k, v in config.items()})
        return aug

    def fbank(self, source: Any, sample_rate: int | None = None, **fbank_kwargs: Any) -> torch.Tensor:
        """A file path (or a waveform with its ``sample_rate``) -> augmented waveform -> log-mel fbank
        (:func:`mmte.data.audio.compute_fbank` with ``fbank_kwargs``) -> SpecAugment (on the natural-log
        power scale the equaliser's dB are defined on) -> the fbank normalisation (``mean``/``std``)
        -> ``[T, F]``."""
        import os

        from .audio import AUDIOSET_MEAN, AUDIOSET_STD, compute_fbank, load_audio, speech_scale, trim_silence

        if isinstance(source, (str, os.PathLike)):
            source, sample_rate = load_audio(source)
        if sample_rate is None:
            raise ValueError("AudioAugment.fbank needs sample_rate when given a waveform")
        mean, std = fbank_kwargs.pop("mean", AUDIOSET_MEAN), fbank_kwargs.pop("std", AUDIOSET_STD)
        trim_db = fbank_kwargs.pop("trim_db", None)
        if trim_db is not None:  # on the recording, before the perturbations (added noise would hide the silence)
            source = trim_silence(source, sample_rate, trim_db, fbank_kwargs.get("frame_length", 25.0), fbank_kwargs.get("frame_shift", 10.0))
        base = fbank_kwargs.pop("vtln_warp", 1.0)  # a fixed warp of the preprocessing, the perturbation on top
        augment = self.waveform.active and float(torch.rand(())) < self.waveform.p
        w = self.waveform(source, sample_rate, draw=False) if augment else source
        warp = base * self.waveform.warp() if augment else base
        if fbank_kwargs.get("frontend") == "speech_embedding":  # its own fixed scale (mean/std refused), after the masks
            return speech_scale(self.spec(compute_fbank(w, sample_rate, mean=mean, std=std, vtln_warp=warp, scaled=False, **fbank_kwargs)))
        fb = self.spec(compute_fbank(w, sample_rate, mean=None, std=None, vtln_warp=warp, **fbank_kwargs))
        return fb if mean is None or std is None else (fb - mean) / (2 * std)
