"""FP8Linear: parity with torchao's Float8Linear, token padding, dtypes, shape errors, TransformerLayer accuracy."""

import pytest
import torch

from mmte import fp8
from mmte.fp8 import MXFP8, BlockScaling, CurrentScaling, DelayedScaling, FP8Linear
from mmte.te import Linear, TransformerLayer

ALL = {
    "delayed": DelayedScaling(amax_history_len=16),
    "current": CurrentScaling(),
    "block": BlockScaling(),
    "mx": MXFP8(),
}


def test_matches_torchao_float8_linear():
    """An independent FP8 implementation (torchao: dynamic tensorwise scales, E4M3 forward, E5M2 grads,
    torch._scaled_mm) gives the same outputs and gradients as CurrentScaling(HYBRID)."""
    pytest.importorskip("torchao")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.float8 import convert_to_float8_training

    g0 = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g0) * 0.1
    b = torch.randn(48, generator=g0)
    x = torch.randn(2, 16, 64, generator=g0)
    gy = torch.randn(2, 16, 48, generator=g0) * 1e-2

    ours = FP8Linear(64, 48, recipe=CurrentScaling())
    theirs = torch.nn.Sequential(torch.nn.Linear(64, 48))
    with torch.no_grad():
        for m in (ours, theirs[0]):
            m.weight.copy_(w)
            m.bias.copy_(b)
    convert_to_float8_training(theirs)
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    with fp8.autocast(recipe=CurrentScaling()):
        yo = ours(xo)
    yt = theirs(xt)
    yo.backward(gy)
    yt.backward(gy)
    torch.testing.assert_close(yo, yt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xo.grad, xt.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours.weight.grad, theirs[0].weight.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours.bias.grad, theirs[0].bias.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", list(ALL))
def test_197_tokens_are_padded_and_match_unpadded_math(name):
    recipe = ALL[name]
    torch.manual_seed(0)
    lin = FP8Linear(64, 32, recipe=recipe)
    x = torch.randn(1, 197, 64, requires_grad=True)
    with fp8.autocast(recipe=recipe):
        y = lin(x)
    assert y.shape == (1, 197, 32)
    y.square().sum().backward()
    # the same rows padded by hand to 208 give the same real rows: padding is invisible
    lin2 = FP8Linear(64, 32, recipe=recipe)
    lin2.load_state_dict({k: v for k, v in lin.state_dict().items() if not k.startswith("fp8_")}, strict=False)
    xp = torch.cat([x.detach(), torch.zeros(1, 11, 64)], 1).requires_grad_()
    with fp8.autocast(recipe=recipe):
        yp = lin2(xp)
    yp[:, :197].square().sum().backward()
    torch.testing.assert_close(y, yp[:, :197], rtol=0, atol=0)
    torch.testing.assert_close(x.grad, xp.grad[:, :197], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(lin.weight.grad, lin2.weight.grad, rtol=1e-5, atol=1e-7)


def test_padding_disabled_raises_naming_the_shape():
    lin = FP8Linear(64, 32)
    with pytest.raises(ValueError, match=r"divisible by 16: input shape \(2, 197, 64\) flattens to 394 rows.*400 rows"), \
            fp8.autocast(recipe=DelayedScaling(pad_tokens=False)):
        lin(torch.randn(2, 197, 64))
    with fp8.autocast(recipe=DelayedScaling(pad_tokens=False)):
        assert lin(torch.randn(2, 200, 64)).shape == (2, 200, 32)


def test_non_divisible_features_raise():
    with pytest.raises(ValueError, match=r"divisible by 16; got Linear\(60, 64\) \(weight shape \(64, 60\)\)"):
        FP8Linear(60, 64)
    with pytest.raises(ValueError, match=r"Linear\(64, 10\)"):
        FP8Linear.from_linear(torch.nn.Linear(64, 10))
    lin = FP8Linear(64, 32)
    with pytest.raises(ValueError, match=r"expects inputs \[\.\.\., 64\]; got shape \(3, 48\)"), fp8.autocast():
        lin(torch.randn(3, 48))


def test_outside_autocast_it_is_a_plain_linear_and_keys_are_unchanged():
    torch.manual_seed(0)
    plain = Linear(64, 32)
    lin = FP8Linear.from_linear(plain)
    assert lin.weight is plain.weight and isinstance(lin, Linear)
    x = torch.randn(5, 64)
    torch.testing.assert_close(lin(x), plain(x), rtol=0, atol=0)
    with fp8.autocast(enabled=False):
        torch.testing.assert_close(lin(x), plain(x), rtol=0, atol=0)
    with fp8.autocast():
        with fp8.autocast(enabled=False):  # a nested disabled region switches FP8 off
            torch.testing.assert_close(lin(x), plain(x), rtol=0, atol=0)
        assert not torch.equal(lin(x), plain(x))
    keys = set(lin.state_dict())
    assert set(plain.state_dict()) | {"fp8_amax_history", "fp8_scale", "fp8_amax_pending"} == keys


def test_output_and_grad_dtypes_under_bf16_autocast():
    lin = FP8Linear(32, 16, recipe=CurrentScaling())
    x = torch.randn(16, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), fp8.autocast(recipe=CurrentScaling()):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and lin.weight.grad.dtype == torch.float32
    lin16 = FP8Linear(32, 16, recipe=CurrentScaling(), params_dtype=torch.bfloat16)
    xb = torch.randn(16, 32, dtype=torch.bfloat16, requires_grad=True)
    with fp8.autocast(recipe=CurrentScaling()):
        yb = lin16(xb)
    yb.float().sum().backward()
    assert yb.dtype == xb.grad.dtype == lin16.weight.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("name", list(ALL))
def test_transformer_layer_within_te_fp8_tolerance(name):
    """A TransformerLayer with all four GEMMs in FP8 stays within TE's FP8 tolerance of fp32."""
    recipe = ALL[name]
    torch.manual_seed(0)
    layer = TransformerLayer(128, 256, 4, self_attn_mask_type="padding")
    ref_layer = TransformerLayer(128, 256, 4, self_attn_mask_type="padding")
    ref_layer.load_state_dict(layer.state_dict())
    fp8.convert(layer, recipe, filter=lambda n, m: True)
    assert sum(isinstance(m, FP8Linear) for m in layer.modules()) == 4
    x = torch.randn(2, 40, 128)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 33:] = False
    for _ in range(2):  # second step: delayed scaling uses its history
        with fp8.autocast(recipe=recipe):
            y = layer(x, mask)
    y_ref = ref_layer(x, mask)
    torch.testing.assert_close(y, y_ref, rtol=0.125, atol=0.0675)
    assert (y - y_ref).abs().max() > 1e-4  # FP8 really ran


def test_convert_default_filter_backbone_only(caplog):
    import logging

    from mmte.encoders import Backbone

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = Linear(48, 64)  # a tokenizer-like projection: stays high precision
            self.backbone = Backbone("tiny")
            self.head = torch.nn.Linear(64, 10)

    m = Model()
    with caplog.at_level(logging.INFO, logger="mmte.fp8.convert"):
        fp8.convert(m, DelayedScaling(amax_history_len=8))
    kinds = {n: type(mod).__name__ for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    assert kinds["stem"] == "Linear" and kinds["head"] == "Linear"
    assert sum(v == "FP8Linear" for v in kinds.values()) == 8  # 2 layers x (qkv, proj, fc1, fc2)
    assert [r.getMessage() for r in caplog.records] == ["converted 8/10 Linear to FP8 (DelayedScaling)"]
    assert m.backbone.layers["0"].layernorm_mlp.fc1.fp8_amax_history.shape == (3, 8)
    fp8.convert(m)  # idempotent
    assert sum(isinstance(v, FP8Linear) for v in m.modules()) == 8
    # an explicit filter may pick any Linear; picking one with bad sizes is an error naming it
    with pytest.raises(ValueError, match=r"Linear\(64, 10\)"):
        fp8.convert(m, filter=lambda n, mod: n == "head")


def test_convert_on_meta_device_then_materialise():
    from mmte.encoders import Backbone

    bb = Backbone("tiny", device="meta")
    fp8.convert(bb)
    fc1 = bb.layers["0"].layernorm_mlp.fc1
    assert fc1.fp8_scale.device.type == "meta"
    bb.to_empty(device="cpu")
    for mod in bb.modules():
        if hasattr(mod, "reset_parameters") and mod is not bb:
            mod.reset_parameters()
    assert torch.equal(fc1.fp8_scale, torch.ones(3)) and not fc1.fp8_amax_history.any()
    with fp8.autocast():
        assert torch.isfinite(bb(torch.randn(2, 17, 64))).all()
