"""Audio tokenizer: AST-style patches of a log-mel fbank (square 16x16, or frame-level strips).

An fbank ``[B, T, F]`` (frames x mel bins, the layout Kaldi's fbank returns) is viewed as a
one-channel image ``[B, 1, F, T]`` and cut into ``pf x pt`` patches every ``sf`` bins / ``st`` frames
by a convolution (``patch_size``/``stride`` are one int for both axes or ``[freq, time]``): the patch
grid is ``F' = (F - pf) // sf + 1`` by ``T' = (T - pt) // st + 1``. A patch spanning all mel bins
(``patch_size: [F, 4]``) gives one token per few frames (frame-level tokens, ``F' = 1``).

``stem: conv`` replaces the patch projection by the convolutional subsampling of speech transformers
(Conformer, ESPnet): two 3x3 convolutions with stride 2 and GELU over the fbank, then a Linear over
channels x remaining mel bins: one token per 4 frames (receptive field 7 frames), ``F' = 1``. Its
locality bias helps when there is little data to learn patches from.

``stem: speech_embedding`` puts Google's pretrained speech embedding
(:mod:`mmte.tokenizers.speech_embedding`, fixed weights) in front of a Linear: its 32-band log-mel
(``frontend: speech_embedding`` in the preprocessing) becomes one 96-d vector every 8 frames (80 ms), each
seeing 76 frames (about 0.78 s) centred on it; the clip is extended by its own quietest level, 38 frames before
and 37 after (and over batch padding), so every real frame is the centre of some window and a padded clip's
tokens equal its unpadded ones. Token ``t`` is real when its centre ``8 t`` lies in the clip. What it
brings is what a few training speakers cannot teach: how words sound in many voices (FSDD
leave-one-speaker-out: see BENCHMARKS.md).

Optionally (``normalize: utterance``) each clip is first standardised per mel bin by its own mean
and standard deviation over its real frames (per-utterance mean/variance normalisation, CMVN): a
speaker's or microphone's fixed spectral colouring is removed, which is what lets a model trained on
a few speakers hold up on a new one. It runs inside the model, so training, test and predict on any
data get the same normalisation.

The position embedding is sized from the grid of the longest input (``max_frames``) and sliced along
time for shorter ones, so a padded clip's real tokens get exactly the embeddings they would get
unpadded. Tokens are ordered time-major (``t * F' + f``); a time column is real when its whole patch
lies inside the clip (``t * st + pt <= frames``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.audio import collate_audio, example_audio, preprocess_audio
from .base import ModalityTokenizer, TokenSeq, prepend_cls
from .registry import register_modality
from .speech_embedding import HOP, WIDTH, WINDOW, SpeechEmbedding

__all__ = ["AudioTokenizer", "utterance_norm"]


def _grid(n: int, patch: int, stride: int) -> int:
    return (n - patch) // stride + 1


def _pair(v, what: str) -> tuple[int, int]:
    """``16`` -> ``(16, 16)``; ``[64, 4]`` -> ``(64, 4)`` (frequency, time)."""
    t = (v, v) if isinstance(v, int) else tuple(v) if isinstance(v, (list, tuple)) else None
    if t is None or len(t) != 2 or not all(isinstance(x, int) and x > 0 for x in t):
        raise ValueError(f"audio tokenizer {what} must be a positive int or [freq, time] of positive ints; got {v!r}")
    return t


def utterance_norm(fbank: torch.Tensor, frames: torch.Tensor | None = None, per_bin: bool = True, eps: float = 1e-5) -> torch.Tensor:
    """Per-utterance mean/variance normalisation over each clip's real frames; padded frames stay 0.

    Args:
        fbank: ``[B, T, F]`` (padded).
        frames: real frames per clip ``[B]`` (None: all ``T``).
        per_bin: standardise every mel bin by its own mean/std (CMVN), or the whole clip by one
            mean/std (level normalisation: the spectral shape is kept, loudness removed).

    Returns:
        ``[B, T, F]``.
    """
    b, t, f = fbank.shape
    if frames is None:
        m = torch.ones(b, t, 1, dtype=fbank.dtype, device=fbank.device)
    else:
        m = (torch.arange(t, device=fbank.device)[None] < frames.to(fbank.device)[:, None]).to(fbank.dtype)[..., None]
    dims = (1,) if per_bin else (1, 2)
    n = (m.sum(1, keepdim=True) * (1 if per_bin else f)).clamp_min(1)
    mean = (fbank * m).sum(dims, keepdim=True) / n
    var = (((fbank - mean) * m) ** 2).sum(dims, keepdim=True) / n
    return (fbank - mean) / (var + eps).sqrt() * m


def _with_context(fbank: torch.Tensor, frames: torch.Tensor | None) -> torch.Tensor:
    """``[B, T, F]`` -> ``[B, 38 + T + 37, F]``: each clip's padding and the context either side set to
    its quietest value over its real frames (what the speech embedding sees around a word); the
    network then gives ``(T - 1) // 8 + 1`` vectors, vector ``t`` centred on frame ``8 t``."""
    b, t, _ = fbank.shape
    x = fbank.float()
    if frames is None:
        real = torch.ones(b, t, 1, dtype=torch.bool, device=x.device)
    else:
        real = (torch.arange(t, device=x.device)[None] < frames.to(x.device)[:, None])[..., None]
    floor = x.masked_fill(~real, float("inf")).amin((1, 2), keepdim=True)
    x = torch.where(real, x, floor)
    return torch.cat([floor.expand(b, WINDOW // 2, x.shape[2]), x, floor.expand(b, WINDOW // 2 - 1, x.shape[2])], 1)


@register_modality(
    "audio",
    preprocess=preprocess_audio,
    collate=collate_audio,
    default_head={"name": "classification", "pool": "mean"},
    example=example_audio,
    example_config={"max_frames": 128},
    variable_length=True,
    description="log-mel fbank {fbank [B, T, 128], frames [B]} (or waveforms): AST 16x16 patches, stride 10",
)
class AudioTokenizer(ModalityTokenizer):
    """Fbank ``[B, T, F]`` (or waveform ``[B, S]``) -> ``[cls] + T' * F'`` patch tokens.

    Args:
        dim: token width.
        num_mel_bins: mel bins ``F``.
        max_frames: longest fbank (frames) the position embedding covers (AST: 1024 = 10.24 s).
        patch_size: patch in bins and frames: one int (square, AST: 16) or ``[freq, time]``
            (``[num_mel_bins, 4]``: frame-level tokens of 4 frames).
        stride: patch stride: one int (10; = patch_size: no overlap) or ``[freq, time]``.
        cls_token: prepend a learned cls token.
        sample_rate: the model's sample rate (waveform inputs are resampled to it).
        fbank_mean, fbank_std: fbank normalisation for waveform inputs (AudioSet's by default).
        normalize: ``None``, ``"utterance"`` (per-utterance, per-mel-bin mean/variance normalisation
            over the clip's real frames, applied to every input) or ``"level"`` (the clip's single
            mean/std over all bins: loudness removed, spectral shape kept).
        stem: ``"patch"`` (a patch projection, AST), ``"conv"`` (2x conv3x3-stride-2 subsampling;
            ``patch_size``/``stride`` are then unused) or ``"speech_embedding"`` (Google's pretrained
            speech embedding, fixed; needs ``num_mel_bins: 32``, no ``normalize``, and the data's
            ``preprocess: {frontend: speech_embedding}``).
        stem_channels: channels of the conv stem.
        stem_weights: the speech-embedding stem's weights: ``"openwakeword"`` (the openwakeword 0.4.0
            package's ``embedding_model.onnx``), a path to that file, or None (random, fixed: tests).
    """

    modality = "audio"

    def __init__(
        self,
        dim: int,
        num_mel_bins: int = 128,
        max_frames: int = 1024,
        patch_size: int | tuple[int, int] | list[int] = 16,
        stride: int | tuple[int, int] | list[int] = 10,
        cls_token: bool = True,
        sample_rate: int = 16000,
        fbank_mean: float = -4.2677393,
        fbank_std: float = 4.5689974,
        normalize: str | None = None,
        stem: str = "patch",
        stem_channels: int = 64,
        stem_weights: str | None = "openwakeword",
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        (pf, pt), (sf, st) = _pair(patch_size, "patch_size"), _pair(stride, "stride")
        if num_mel_bins < pf or max_frames < pt:
            raise ValueError(
                f"num_mel_bins ({num_mel_bins}) and max_frames ({max_frames}) must be >= the patch's [freq, time] = [{pf}, {pt}]"
            )
        if normalize not in (None, "utterance", "level"):
            raise ValueError(f"audio tokenizer normalize must be None, 'utterance' or 'level'; got {normalize!r}")
        if stem not in ("patch", "conv", "speech_embedding"):
            raise ValueError(f"audio tokenizer stem must be 'patch', 'conv' or 'speech_embedding'; got {stem!r}")
        if stem == "speech_embedding" and (num_mel_bins != 32 or normalize is not None):
            raise ValueError("the speech_embedding stem takes the 32-band log-mel of preprocess frontend: speech_embedding as "
                             f"it is: num_mel_bins must be 32 and normalize None; got {num_mel_bins}, {normalize!r}")
        kw = {"device": device, "dtype": params_dtype}
        self.stem_kind = stem
        if stem == "conv":
            if num_mel_bins < 7 or max_frames < 7:
                raise ValueError(f"the conv stem needs num_mel_bins and max_frames >= 7; got {num_mel_bins}, {max_frames}")
            pf, pt, sf, st = num_mel_bins, 7, num_mel_bins, 4  # one token per 4 frames, receptive field 7 frames
            f_out = _grid(_grid(num_mel_bins, 3, 2), 3, 2)
            self.stem = nn.Sequential(
                nn.Conv2d(1, stem_channels, 3, 2, **kw), nn.GELU(), nn.Conv2d(stem_channels, stem_channels, 3, 2, **kw), nn.GELU()
            )
            self.proj = nn.Linear(stem_channels * f_out, dim, **kw)
            self.freq_grid, self.max_time_grid = 1, _grid(_grid(max_frames, 3, 2), 3, 2)
        elif stem == "speech_embedding":
            pf, pt, sf, st = num_mel_bins, 1, num_mel_bins, HOP  # token t: the window centred on frame 8 t
            self.stem = SpeechEmbedding(stem_weights, device=device)
            self.proj = nn.Linear(WIDTH, dim, **kw)
            self.freq_grid, self.max_time_grid = 1, _grid(max_frames, pt, st)
        else:
            self.stem = None
            self.proj = nn.Conv2d(1, dim, (pf, pt), (sf, st), **kw)
            self.freq_grid, self.max_time_grid = _grid(num_mel_bins, pf, sf), _grid(max_frames, pt, st)
        self.num_mel_bins, self.max_frames, self.patch_size, self.stride = num_mel_bins, max_frames, patch_size, stride
        self.patch_time, self.stride_time, self.normalize = pt, st, normalize
        self.sample_rate, self.fbank_mean, self.fbank_std = sample_rate, fbank_mean, fbank_std
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        self.num_prefix_tokens = int(cls_token)
        # [1, T'max, F', D] so that time can be sliced
        self.pos_embed = nn.Parameter(torch.empty(1, self.max_time_grid, self.freq_grid, dim, **kw))
        self.cls_pos = nn.Parameter(torch.empty(1, 1, dim, **kw)) if cls_token else None
        if self.proj.weight.device.type != "meta":
            self.reset_parameters()

    @property
    def frontend(self) -> str:
        """The spectrogram the stem reads (``compute_fbank``'s ``frontend``)."""
        return "speech_embedding" if self.stem_kind == "speech_embedding" else "kaldi"

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()
        if isinstance(self.stem, SpeechEmbedding):
            self.stem.reset_parameters()
        elif self.stem is not None:
            for m in self.stem:
                if isinstance(m, nn.Conv2d):
                    m.reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
            nn.init.trunc_normal_(self.cls_pos, std=0.02)

    def num_tokens(self, frames: int) -> int:
        """Token count of a clip: ``cls + ((F - pf) // sf + 1) * ((frames - pt) // st + 1)`` (conv stem:
        ``cls + ((frames - 3) // 2 - 2) // 2 + 1``; speech embedding: ``cls + (frames - 1) // 8 + 1``)."""
        if self.frontend == "speech_embedding":
            return self.num_prefix_tokens + _grid(frames, 1, HOP)
        if self.stem is not None:
            return self.num_prefix_tokens + _grid(_grid(frames, 3, 2), 3, 2)
        return self.num_prefix_tokens + self.freq_grid * _grid(frames, self.patch_time, self.stride_time)

    def export_dims(self) -> dict[str, dict[int, tuple[int, int]]]:
        """The fbank's frames (dim 1) vary from clip to clip: an exported graph takes any length the
        tokenizer does, from the patch's frames (at least 2: the exporter specialises sizes 0 and 1) to
        ``max_frames``."""
        return {"fbank": {1: (max(2, self.patch_time), self.max_frames)}}

    def fbank(self, waveform: torch.Tensor, lengths: torch.Tensor | None = None, sample_rate: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Waveforms ``[B, S]`` -> padded fbank ``[B, T, F]`` and frame counts ``[B]`` (per-sample Kaldi fbank)."""
        from ..data.audio import collate_audio, compute_fbank

        if waveform.dim() != 2:
            raise ValueError(f"audio tokenizer expects a waveform [B, S] or fbank [B, T, F={self.num_mel_bins}]; got shape {tuple(waveform.shape)}")
        sr = sample_rate or self.sample_rate
        n = lengths.tolist() if lengths is not None else [waveform.shape[1]] * waveform.shape[0]
        norm = {"mean": self.fbank_mean, "std": self.fbank_std} if self.frontend == "kaldi" else {"mean": None, "std": None}
        fbs = [
            compute_fbank(w[: int(k)].float().cpu(), sr, self.sample_rate, self.num_mel_bins, frontend=self.frontend, **norm)
            for w, k in zip(waveform, n)
        ]
        out = collate_audio(fbs)
        return out["fbank"].to(waveform.device), out["frames"].to(waveform.device)

    def forward(
        self,
        fbank: torch.Tensor | None = None,
        frames: torch.Tensor | None = None,
        *,
        waveform: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        sample_rate: int | None = None,
    ) -> TokenSeq:
        """Args:
            fbank: ``[B, T, F]`` normalised log-mel fbank (padded).
            frames: real frames per clip ``[B]`` (None: all ``T``).
            waveform: alternatively raw waveforms ``[B, S]`` at ``sample_rate`` with ``lengths`` samples.

        Returns:
            TokenSeq with ``[B, 1 + T' * F', D]`` tokens and a mask when clips are padded.
        """
        if waveform is not None:
            fbank, frames = self.fbank(waveform, lengths, sample_rate)
        if fbank is None:
            raise ValueError("audio tokenizer needs fbank [B, T, F] or waveform [B, S]")
        if fbank.dim() != 3 or fbank.shape[-1] != self.num_mel_bins:
            raise ValueError(
                f"audio tokenizer expects a waveform [B, S] or fbank [B, T, F={self.num_mel_bins}]; got shape {tuple(fbank.shape)}"
            )
        b, t, _ = fbank.shape
        if t < self.patch_time:
            raise ValueError(f"audio clip has {t} frames; at least patch_size={self.patch_size!r} ({self.patch_time} frames) expected")
        if t > self.max_frames:
            raise ValueError(f"audio clip has {t} frames; this tokenizer takes at most max_frames={self.max_frames}")
        if frames is not None and tuple(frames.shape) != (b,):
            raise ValueError(f"frames must be [B={b}]; got shape {tuple(frames.shape)}")
        if self.normalize is not None:
            fbank = utterance_norm(fbank.float(), frames, per_bin=self.normalize == "utterance")
        img = None if self.frontend == "speech_embedding" else fbank.transpose(1, 2).unsqueeze(1).to(self.proj.weight.dtype)  # [B, 1, F, T]
        if img is None:
            x = self.proj(self.stem(_with_context(fbank, frames)))[:, :, None]  # [B, T', 1, D]
        elif self.stem is None:
            x = self.proj(img).permute(0, 3, 2, 1)  # [B, D, F', T'] -> [B, T', F', D]  time-major
        else:
            h = self.stem(img)  # [B, C, F'', T']
            x = self.proj(h.permute(0, 3, 1, 2).flatten(2))[:, :, None]  # [B, T', 1, D]
        tg = x.shape[1]
        x = (x + self.pos_embed[:, :tg]).flatten(1, 2)
        mask = None
        if frames is not None:
            if not torch.compiler.is_exporting() and bool((frames < self.patch_time).any()):  # exported graphs: no data-dependent check
                raise ValueError(f"every clip needs >= {self.patch_time} frames (patch_size={self.patch_size!r}); got frames {frames.tolist()}")
            real_t = torch.arange(tg, device=x.device)[None] * self.stride_time + self.patch_time <= frames[:, None].to(x.device)
            mask = real_t[:, :, None].expand(b, tg, self.freq_grid).flatten(1)
        x, mask = prepend_cls(None if self.cls_token is None else self.cls_token + self.cls_pos, x, mask)
        return TokenSeq(x, mask, self.num_prefix_tokens, extras={"grid_size": (tg, self.freq_grid)})
