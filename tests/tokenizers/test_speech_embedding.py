"""The speech-embedding front end and stem against the ONNX files they are read from, run by onnxruntime
(an independent implementation of the same graphs), on real FSDD clips; then the stem inside the audio
tokenizer: padding, token counts, meta-device construction and the errors users meet."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from mmte.data.audio import collate_audio, compute_fbank, load_audio, speech_mel, speech_scale
from mmte.tokenizers.audio import AudioTokenizer
from mmte.tokenizers.speech_embedding import WINDOW, SpeechEmbedding, default_weights_path, read_weights

ROOT = Path(__file__).resolve().parents[2]
FSDD = ROOT / ".." / "shared" / "data" / "fsdd" / "recordings"
CLIPS = ["0_george_5.wav", "3_jackson_12.wav", "6_nicolas_30.wav", "9_yweweler_49.wav", "7_theo_8.wav"]
ort = pytest.importorskip("onnxruntime")


def _clips():
    from tests.conftest import need_data

    root = need_data(FSDD, "FSDD recordings")
    return [load_audio(root / c) for c in CLIPS]


def _session(name: str):
    path = os.path.join(os.path.dirname(default_weights_path()), name)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(path, opts)


def _mel(w, sr):
    return compute_fbank(w, sr, target_rate=16000, num_mel_bins=32, frontend="speech_embedding")


def test_frontend_matches_the_packaged_melspectrogram_graph():
    """compute_fbank(frontend=speech_embedding) equals openwakeword's melspectrogram.onnx followed by its
    ``x / 10 + 2`` on the same 16 kHz samples (FSDD's 8 kHz clips resampled by torchaudio), within 1e-4."""
    import torchaudio

    sess = _session("melspectrogram.onnx")
    for w, sr in _clips():
        w16 = torchaudio.functional.resample(w, sr, 16000)
        ref = sess.run(None, {"input": (w16.numpy() * 32768.0)[None]})[0].squeeze() / 10 + 2
        got = _mel(w, sr)
        assert got.shape == (1 + (w16.shape[0] - 512) // 160, 32) == ref.shape
        np.testing.assert_allclose(got.numpy(), ref, atol=1e-4, rtol=0)
        assert float(got.max() - got.min()) <= 8.0 + 1e-5  # the 80 dB floor
    # the unscaled natural-log power, scaled afterwards, is the same thing (augmentation works in between)
    w16 = torchaudio.functional.resample(*_clips()[0][:1], 8000, 16000)
    torch.testing.assert_close(speech_scale(speech_mel(w16)), _mel(*_clips()[0]), atol=1e-5, rtol=0)


def test_stem_matches_the_packaged_embedding_graph_window_by_window():
    """The torch network on a whole clip equals embedding_model.onnx on each 76-frame window every 8
    frames (what openwakeword does), to 1e-4 of the outputs' scale."""
    sess, net = _session("embedding_model.onnx"), SpeechEmbedding()
    for w, sr in _clips()[:3]:
        mel = _mel(w, sr)
        mel = torch.cat([mel, mel.flip(0), mel])[:, :].contiguous()  # > 76 frames for every clip
        mel = mel[: WINDOW + 8 * ((mel.shape[0] - WINDOW) // 8) + 5]  # 5 frames past the last whole window
        n = (mel.shape[0] - WINDOW) // 8 + 1
        wins = np.stack([mel[i * 8: i * 8 + WINDOW].numpy() for i in range(n)])[..., None]
        ref = sess.run(None, {"input_1": wins})[0].reshape(n, 96)
        got = net(mel[None])[0]
        assert got.shape == (n, 96)
        np.testing.assert_allclose(got.numpy(), ref, atol=1e-4 * float(np.abs(ref).max()), rtol=0)


def test_tokenizer_stem_pads_clips_with_their_quietest_frame():
    """In a padded batch each clip's real tokens equal the clip alone; token counts follow num_tokens; the
    result equals the stem run by hand on the clip extended by 38 / 37 frames of its minimum."""
    torch.manual_seed(0)
    tok = AudioTokenizer(48, num_mel_bins=32, max_frames=160, stem="speech_embedding").eval()
    mels = [_mel(w, sr)[:160] for w, sr in _clips()]
    out = tok(**collate_audio(mels))
    assert out.mask.sum(1).tolist() == [tok.num_tokens(m.shape[0]) for m in mels]  # the cls token counts
    for i, m in enumerate(mels):
        one = tok(fbank=m[None])
        n = one.tokens.shape[1]
        assert n == tok.num_tokens(m.shape[0]) == 1 + (m.shape[0] - 1) // 8 + 1
        torch.testing.assert_close(out.tokens[i, :n], one.tokens[0], atol=1e-4, rtol=1e-4)
    m = mels[1]
    ext = torch.cat([m.min().expand(38, 32), m, m.min().expand(37, 32)])
    by_hand = tok.proj(tok.stem(ext[None]))[0] + tok.pos_embed[0, : (m.shape[0] - 1) // 8 + 1, 0]
    torch.testing.assert_close(tok(fbank=m[None]).tokens[0, 1:], by_hand, atol=1e-5, rtol=1e-5)
    # waveforms go through the same front end
    w, sr = _clips()[1]
    torch.testing.assert_close(tok(waveform=w[None], sample_rate=sr).tokens, tok(fbank=_mel(w, sr)[None]).tokens, atol=1e-5, rtol=1e-5)


def test_stem_weights_are_fixed_buffers_reloaded_after_meta_construction():
    tok = AudioTokenizer(32, num_mel_bins=32, max_frames=64, stem="speech_embedding")
    names = {n for n, _ in tok.named_parameters()}
    assert not any(n.startswith("stem.") for n in names)  # no freeze policy can make them trainable
    assert {"stem.w0", "stem.b1", "stem.w19", "stem.bn_scale"} <= set(tok.state_dict())
    with torch.device("meta"):
        meta = AudioTokenizer(32, num_mel_bins=32, max_frames=64, stem="speech_embedding")
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    for k, v in read_weights().items():
        torch.testing.assert_close(getattr(meta.stem, k), v, atol=0, rtol=0)


def test_speech_embedding_errors_name_the_value(tmp_path):
    with pytest.raises(ValueError, match=r"num_mel_bins must be 32 and normalize None; got 64, None"):
        AudioTokenizer(32, num_mel_bins=64, stem="speech_embedding")
    with pytest.raises(ValueError, match=r"got 32, 'level'"):
        AudioTokenizer(32, num_mel_bins=32, stem="speech_embedding", normalize="level")
    w = torch.randn(8000) * 0.1
    with pytest.raises(ValueError, match=r"frontend speech_embedding is fixed at .*got \{'target_rate': 8000\}"):
        compute_fbank(w, 8000, target_rate=8000, num_mel_bins=32, frontend="speech_embedding")
    with pytest.raises(ValueError, match=r"mean/std must be left unset; got 0.0, 1.0"):
        compute_fbank(w, 8000, num_mel_bins=32, mean=0.0, std=1.0, frontend="speech_embedding")
    with pytest.raises(ValueError, match=r"audio frontend must be one of \('kaldi', 'speech_embedding'\); got 'mfcc'"):
        compute_fbank(w, 8000, frontend="mfcc")
    with pytest.raises(FileNotFoundError, match=r"speech-embedding weights not found: .*nope.onnx"):
        SpeechEmbedding(tmp_path / "nope.onnx")
    with pytest.raises(ValueError, match=r"expects a log-mel \[B, T >= 76, 32\]; got shape \(1, 40, 32\)"):
        SpeechEmbedding(None)(torch.zeros(1, 40, 32))
    from mmte.training.data import FolderDataModule

    with pytest.raises(ValueError, match=r"normalize 'train' .* frontend speech_embedding has its own fixed scale"):
        FolderDataModule(data_dir=str(tmp_path), modality="audio", label_regex="^(\\d+)_", normalize="train", preprocess={"frontend": "speech_embedding"})


def test_a_stem_and_a_data_frontend_that_disagree_are_refused():
    """The data module tells the model which spectrogram it computes (model_info -> data_info); the speech stem
    on Kaldi fbanks (or a Kaldi stem on the speech log-mel) would train on the wrong scale without a word."""
    from mmte.training.model_spec import apply_data_info

    heads = {"y": {"name": "classification"}}
    speech = {"audio": {"name": "audio", "num_mel_bins": 32, "stem": "speech_embedding"}}
    toks, _ = apply_data_info(speech, heads, {"num_classes": 10, "audio_frontend": "speech_embedding"})
    assert toks["audio"]["stem"] == "speech_embedding"
    with pytest.raises(ValueError, match=r"stem 'speech_embedding', which reads the 'speech_embedding' spectrogram, but the data's "
                                         r"preprocess frontend is 'kaldi'"):
        apply_data_info(speech, heads, {"num_classes": 10, "audio_frontend": "kaldi"})
    with pytest.raises(ValueError, match=r"stem 'patch', which reads the 'kaldi' spectrogram"):
        apply_data_info({"audio": "audio"}, heads, {"num_classes": 10, "audio_frontend": "speech_embedding"})


def test_training_augmentation_runs_on_the_speech_log_mel_before_its_scale():
    """AudioAugment with the speech front end masks the natural-log power and then applies the fixed scale:
    the frames a time mask leaves alone equal the plain front end's exactly, the masked ones hold the clip's
    mean level; mean/std are refused on this path too."""
    from mmte.data.augment import AudioAugment

    w, sr = _clips()[0]
    aug = AudioAugment.from_config({"time_masks": 1, "time_width": 12})
    plain = _mel(w, sr)
    hit = 0
    for seed in range(8):
        torch.manual_seed(seed)
        got = aug.fbank(w, sr, target_rate=16000, num_mel_bins=32, frontend="speech_embedding")
        same = (got == plain).all(1)
        assert got.shape == plain.shape and int((~same).sum()) <= 12  # a mask is U[0, 12] frames wide
        masked = got[~same]
        assert torch.allclose(masked, masked[:1].expand_as(masked))  # one value: the clip's mean, scaled
        hit += int((~same).sum())
    assert hit > 0
    with pytest.raises(ValueError, match=r"mean/std must be left unset; got 0.0, 1.0"):
        aug.fbank(w, sr, target_rate=16000, num_mel_bins=32, frontend="speech_embedding", mean=0.0, std=1.0)
