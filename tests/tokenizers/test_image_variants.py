"""Weight adaptation between image-like tokenizers: RGB -> single channel, image -> video."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mmte
from mmte.tokenizers.image import ImageTokenizer, adapt_input_channels
from mmte.tokenizers.infrared import InfraredTokenizer, XRayTokenizer
from mmte.tokenizers.video import VideoTokenizer


def test_rgb_patch_embed_summed_for_grey():
    rgb = ImageTokenizer(32, img_size=32, patch_size=16)
    for cls in (InfraredTokenizer, XRayTokenizer):
        grey = cls(32, img_size=32, patch_size=16)
        grey.load_rgb(rgb)
        torch.testing.assert_close(grey.proj.weight, rgb.proj.weight.sum(1, keepdim=True))
        x = torch.rand(2, 1, 32, 32)
        # a grey image through the adapted stem == its RGB replica through the RGB stem
        torch.testing.assert_close(grey(x).tokens, rgb(x.expand(-1, 3, -1, -1)).tokens, rtol=1e-5, atol=1e-5)


def test_adapt_channels_tiles():
    w = torch.randn(8, 3, 4, 4)
    w4 = adapt_input_channels(w, 4)
    assert w4.shape == (8, 4, 4, 4)
    torch.testing.assert_close(w4[:, :3], w * 0.75)


def test_video_inflation_static_clip_equals_image():
    img = ImageTokenizer(32, img_size=32, patch_size=16)
    vid = VideoTokenizer(32, img_size=32, patch_size=16, max_frames=4)
    vid.inflate_from_image(img)
    with torch.no_grad():
        vid.time_embed.zero_()
        vid.cls_token.copy_(img.cls_token)
    frame = torch.rand(1, 3, 32, 32)
    clip = frame[:, :, None].expand(-1, -1, 4, -1, -1)
    v = vid(clip).tokens  # [1, 1 + 2*4, D]
    i = img(frame).tokens  # [1, 1 + 4, D] (cls has its own position in the image tokenizer)
    patches_v = v[:, 1:].reshape(1, 2, 4, 32)
    for t in range(2):
        torch.testing.assert_close(patches_v[:, t], i[:, 1:], rtol=1e-5, atol=1e-5)


def test_create_names_match_classes():
    assert type(mmte.tokenizers.create("infrared", dim=16, img_size=32)) is InfraredTokenizer
    assert type(mmte.tokenizers.create("xray", dim=16, img_size=32)) is XRayTokenizer


def test_patch_embed_linear_path_matches_the_convolution():
    """Inference runs the non-overlapping patch convolution as one GEMM over flattened patches: the same
    tokens as the convolution (float64 reference), for non-square patches, several channels and another size."""
    from mmte.tokenizers.image import patch_embed
    from tests.op_log import OpLog

    torch.manual_seed(0)
    tok = ImageTokenizer(24, img_size=(16, 32), patch_size=(4, 8), in_chans=3).eval()
    for size in ((16, 32), (8, 16)):
        x = torch.randn(2, 3, *size)
        ref = F.conv2d(x.double(), tok.proj.weight.double(), tok.proj.bias.double(), stride=(4, 8))
        ref = ref.flatten(2).transpose(1, 2).float()
        with torch.inference_mode(), OpLog() as log:
            out, grid = patch_embed(tok.proj, x)
        assert grid == (size[0] // 4, size[1] // 8)
        assert not any("conv" in name for name, _, _ in log.ops)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        with OpLog() as log:  # autograd on: the convolution itself
            out_grad, _ = patch_embed(tok.proj, x)
        assert any("conv" in name for name, _, _ in log.ops)
        torch.testing.assert_close(out_grad, ref, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():  # the tokenizer's output is unchanged by the path
        torch.testing.assert_close(tok(x).tokens, torch.enable_grad()(tok)(x).tokens.detach(), rtol=1e-5, atol=1e-5)
    # a partial last patch (17 x 35 with 4 x 8 patches): dropped, as the convolution does
    x = torch.randn(2, 3, 17, 35)
    ref = F.conv2d(x, tok.proj.weight, tok.proj.bias, stride=(4, 8)).flatten(2).transpose(1, 2)
    with torch.inference_mode():
        out, grid = patch_embed(tok.proj, x)
    assert grid == (4, 4)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    seen = []
    own = tok.proj.register_forward_hook(lambda m, i, o: seen.append(1))  # a hooked convolution runs as a module
    with torch.inference_mode():
        tok(torch.randn(2, 3, 16, 32))
    assert seen == [1]
    seen.clear()
    own.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: seen.append(type(m).__name__))
    try:  # ... and so does one under a global hook
        with torch.inference_mode():
            patch_embed(tok.proj, torch.randn(1, 3, 16, 32))
    finally:
        handle.remove()
    assert seen == ["Conv2d"]
