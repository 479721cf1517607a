"""Library code that replaced hand-written code, held to the formulas it replaced.

Each reference below is the hand-written formula mmte used before (written out here, independent of
the library call now in ``mmte``); the library-backed function must match it bit for bit (or, where
floating-point order differs, within the stated tolerance).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmte.tokenizers.image import ImageTokenizer, adapt_input_channels, resample_pos_embed
from mmte.tokenizers.point_cloud import knn


def _old_resample(pos, new_grid, old_grid, num_prefix):
    if tuple(new_grid) == tuple(old_grid):
        return pos
    prefix, grid = pos[:, :num_prefix], pos[:, num_prefix:]
    d = grid.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], d).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=new_grid, mode="bicubic", antialias=True, align_corners=False)
    return torch.cat([prefix, grid.permute(0, 2, 3, 1).reshape(1, -1, d).to(pos.dtype)], 1)


def _old_adapt(weight, in_chans):
    c = weight.shape[1]
    if in_chans == c:
        return weight
    if in_chans == 1:
        return weight.sum(1, keepdim=True)
    reps = -(-in_chans // c)
    return weight.repeat(1, reps, *([1] * (weight.dim() - 2)))[:, :in_chans] * (c / in_chans)


def test_pos_embed_resampling_is_timms_and_bit_identical_to_the_old_formula():
    g = torch.Generator().manual_seed(0)
    for dtype, prefix, old, new in [
        (torch.float32, 1, (14, 14), (16, 16)),  # up, with a cls row
        (torch.float32, 5, (8, 8), (4, 6)),  # down and rectangular, cls + 4 registers
        (torch.float32, 0, (6, 10), (6, 10)),  # unchanged: the same tensor back
        (torch.bfloat16, 1, (4, 4), (7, 3)),
    ]:
        pos = torch.randn(1, prefix + old[0] * old[1], 24, generator=g).to(dtype)
        got, ref = resample_pos_embed(pos, new, old, prefix), _old_resample(pos, new, old, prefix)
        assert got.shape == (1, prefix + new[0] * new[1], 24) and got.dtype == dtype
        assert torch.equal(got, ref), (dtype, prefix, old, new)
        assert torch.equal(got[:, :prefix], pos[:, :prefix])
        if old == new:
            assert got is pos


def test_image_tokenizer_at_another_resolution_uses_the_resampled_embedding():
    """Through the real tokenizer: tokens at 48 px = patches + the 32 px embedding resampled to 3 x 3."""
    torch.manual_seed(0)
    tok = ImageTokenizer(16, img_size=32, patch_size=16)
    x = torch.randn(2, 3, 48, 48)
    seq = tok(x)
    patches = tok.proj(x).flatten(2).transpose(1, 2)
    pos = _old_resample(tok.pos_embed, (3, 3), (2, 2), tok.num_prefix_tokens)
    ref = torch.cat([tok.cls_token.expand(2, -1, -1), patches], 1) + pos
    torch.testing.assert_close(seq.tokens, ref, rtol=1.3e-6, atol=1e-5)


def test_input_channel_adaptation_is_timms_and_bit_identical_to_the_old_formula():
    w = torch.randn(32, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    for in_chans in (1, 2, 3, 4, 7):
        got, ref = adapt_input_channels(w, in_chans), _old_adapt(w, in_chans)
        assert got.shape == (32, in_chans, 16, 16) and torch.equal(got, ref), in_chans
    assert adapt_input_channels(w, 3) is w
    # the property the infrared tokenizer relies on: a grey image through the summed kernel = its RGB replica
    grey = torch.randn(2, 1, 32, 32)
    torch.testing.assert_close(
        F.conv2d(grey, adapt_input_channels(w, 1), stride=16), F.conv2d(grey.expand(-1, 3, -1, -1), w, stride=16), rtol=1e-5, atol=1e-4
    )


def _old_knn(query, xyz, k, num_points=None):
    p = xyz.shape[1]
    d = ((query.float()[:, :, None] - xyz.float()[:, None]) ** 2).sum(-1)
    if num_points is not None:
        valid = torch.arange(p)[None] < num_points[:, None]
        d = d.masked_fill(~valid[:, None], float("inf"))
    return d.topk(k, dim=-1, largest=False).indices


def test_knn_by_cdist_picks_the_old_neighbours():
    """Same neighbour sets, in the same order, as the squared-difference formula (random clouds have no
    ties); padded points are never picked."""
    g = torch.Generator().manual_seed(2)
    xyz = torch.randn(3, 200, 3, generator=g)
    query = xyz[:, :16] + 0.01 * torch.randn(3, 16, 3, generator=g)
    n = torch.tensor([200, 150, 64])
    for num_points in (None, n):
        got, ref = knn(query, xyz, 12, num_points), _old_knn(query, xyz, 12, num_points)
        assert torch.equal(got, ref)
    assert int(knn(query, xyz, 12, n)[2].max()) < 64


def test_activation_checkpointing_changes_no_gradient():
    """A tiny real MetaTransformer with every backbone layer checkpointed: the same FQNs, the same loss and
    gradients bit for bit, fewer tensors kept for backward, and the layers run again in backward."""
    from mmte.model import MetaTransformer
    from mmte.parallel import apply_activation_checkpointing

    def build():
        torch.manual_seed(0)
        return MetaTransformer({"image": {"name": "image", "img_size": 32, "patch_size": 16}}, "tiny",
                               {"digit": {"name": "classification", "num_classes": 3}}, freeze="none")

    batch = {"image": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)), "label": torch.tensor([0, 2])}

    def step(model):
        calls, saved = [], [0]
        model.backbone.layers["1"].layernorm_mlp.fc1.register_forward_hook(lambda *a: calls.append(1))

        def pack(t):
            saved[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model.loss(model(batch), batch)["loss"]
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, len(calls), saved[0]

    plain, ac = build(), build()
    assert apply_activation_checkpointing([ac]) == 2 and apply_activation_checkpointing([ac]) == 0  # idempotent
    assert [n for n, _ in ac.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert type(ac.backbone.layers["0"]) is type(plain.backbone.layers["0"])
    (l0, g0, c0, s0), (l1, g1, c1, s1) = step(plain), step(ac)
    assert torch.equal(l0, l1) and all(torch.equal(g0[n], g1[n]) for n in g0)
    assert (c0, c1) == (1, 2) and s1 < s0 / 2
