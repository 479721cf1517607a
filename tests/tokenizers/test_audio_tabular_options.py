"""Audio tokenizer options (rectangular / frame-level patches, conv stem, per-utterance and level
normalisation) and the tabular tokenizer's periodic numeric embeddings, each against a naive
re-computation with the module's own weights; padding never changes a clip's real tokens."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mmte.tokenizers.audio import AudioTokenizer
from mmte.tokenizers.tabular import TabularTokenizer

TOL = {"rtol": 1.3e-6, "atol": 1e-5}


def test_frame_level_patches_match_a_naive_unfold():
    tok = AudioTokenizer(16, num_mel_bins=12, max_frames=40, patch_size=[12, 4], stride=[12, 2], cls_token=False)
    fb = torch.randn(2, 23, 12)
    out = tok(fb).tokens
    n = (23 - 4) // 2 + 1
    assert out.shape == (2, n, 16) and tok.num_tokens(23) == n
    w = tok.proj.weight.reshape(16, 12 * 4)  # [D, F*pt] (conv weight layout: [D, 1, F, pt])
    for t in range(n):
        patch = fb[:, 2 * t : 2 * t + 4].transpose(1, 2).reshape(2, -1)  # [B, F*pt]
        torch.testing.assert_close(out[:, t], patch @ w.t() + tok.proj.bias + tok.pos_embed[0, t, 0], **TOL)
    with pytest.raises(ValueError, match=r"patch_size must be a positive int or \[freq, time\] of positive ints; got \[12, 0\]"):
        AudioTokenizer(16, num_mel_bins=12, max_frames=40, patch_size=[12, 0])


def test_conv_stem_matches_explicit_convolutions_and_padding():
    torch.manual_seed(0)
    tok = AudioTokenizer(16, num_mel_bins=20, max_frames=60, stem="conv", stem_channels=4)
    fb = torch.randn(3, 37, 20)
    frames = torch.tensor([37, 21, 9])
    seq = tok(fb, frames)
    c1, c2 = tok.stem[0], tok.stem[2]
    for i, t in enumerate(frames.tolist()):
        x = fb[i : i + 1, :t].transpose(1, 2)[:, None]  # [1, 1, F, T]
        h = F.gelu(F.conv2d(F.gelu(F.conv2d(x, c1.weight, c1.bias, 2)), c2.weight, c2.bias, 2))  # [1, C, F'', T']
        ref = h.permute(0, 3, 1, 2).flatten(2) @ tok.proj.weight.t() + tok.proj.bias
        n = ((t - 3) // 2 + 1 - 3) // 2 + 1
        assert tok.num_tokens(t) == 1 + n and int(seq.mask[i].sum()) == 1 + n
        torch.testing.assert_close(seq.tokens[i, 1 : 1 + n], ref[0] + tok.pos_embed[0, :n, 0], **TOL)


@pytest.mark.parametrize("mode", ["utterance", "level"])
def test_normalisation_uses_only_real_frames(mode):
    torch.manual_seed(1)
    tok = AudioTokenizer(16, num_mel_bins=16, max_frames=64, patch_size=16, stride=8, normalize=mode)
    plain = AudioTokenizer(16, num_mel_bins=16, max_frames=64, patch_size=16, stride=8)
    plain.load_state_dict(tok.state_dict())
    fb = torch.randn(2, 48, 16) * 3 + 5
    frames = torch.tensor([48, 30])
    seq = tok(fb, frames)
    for i, t in enumerate(frames.tolist()):
        clip = fb[i, :t].double()
        if mode == "utterance":  # every mel bin standardised over the clip's frames
            z = (clip - clip.mean(0)) / (clip.var(0, unbiased=False) + 1e-5).sqrt()
        else:  # one mean/std for the whole clip
            z = (clip - clip.mean()) / (clip.var(unbiased=False) + 1e-5).sqrt()
        ref = plain(z.float()[None]).tokens[0]
        n = ref.shape[0]
        torch.testing.assert_close(seq.tokens[i, :n], ref, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"normalize must be None, 'utterance' or 'level'; got 'cmvn'"):
        AudioTokenizer(16, num_mel_bins=16, normalize="cmvn")


def test_periodic_numeric_embeddings_match_the_formula():
    torch.manual_seed(2)
    tok = TabularTokenizer(8, num_numeric=3, cardinalities=(4,), numeric_embedding="periodic", num_frequencies=5, frequency_scale=0.5)
    x = torch.randn(4, 3)
    x[1, 2] = float("nan")
    cat = torch.tensor([[0], [3], [-1], [2]])
    out = tok(x, cat).tokens  # [B, 1 + 3 + 1, D]
    for b in range(4):
        for j in range(3):
            if math.isnan(float(x[b, j])):
                ref = tok.num_missing[j]
            else:
                v = 2 * math.pi * tok.num_freq[j] * x[b, j]
                ref = torch.relu(torch.cat([torch.sin(v), torch.cos(v)]) @ tok.num_weight[j] + tok.num_bias[j])
            torch.testing.assert_close(out[b, 1 + j], ref, **TOL)
    assert tok.num_freq.std() > 0.2  # initialised from N(0, 0.5^2)
    with pytest.raises(ValueError, match=r"numeric_embedding must be 'linear' or 'periodic'; got 'plr'"):
        TabularTokenizer(8, num_numeric=2, numeric_embedding="plr")
