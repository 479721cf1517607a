"""FP8 scaling state in checkpoints, and FP8 inference weights (memory measured against bf16)."""

import copy
import io

import pytest
import torch

from mmte import fp8
from mmte.encoders import Backbone
from mmte.fp8 import MXFP8, BlockScaling, CurrentScaling, DelayedScaling, FP8Linear

RECIPES = {
    "delayed": DelayedScaling(amax_history_len=8),
    "current": CurrentScaling(),
    "block": BlockScaling(),
    "mx": MXFP8(),
}


def _step(model, recipe, x, opt):
    with fp8.autocast(recipe=recipe):
        y = model(x)
    loss = y.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return y.detach()


def test_scaling_history_survives_a_checkpoint_round_trip():
    recipe = DelayedScaling(amax_history_len=8)
    torch.manual_seed(0)
    a = fp8.convert(Backbone("tiny"), recipe)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    xs = [torch.randn(2, 17, 64) * (1 + i) for i in range(5)]
    for x in xs[:3]:
        _step(a, recipe, x, opt_a)
    buf = io.BytesIO()
    torch.save({"model": a.state_dict(), "opt": opt_a.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, weights_only=True)
    fc1 = "layers.0.layernorm_mlp.fc1."
    assert ck["model"][fc1 + "fp8_amax_history"].shape == (3, 8)
    assert (ck["model"][fc1 + "fp8_amax_history"][:2, :3] > 0).all()  # three forward updates recorded
    assert ck["model"][fc1 + "fp8_amax_pending"][2] > 0  # the last backward's amax, applied at the next step

    torch.manual_seed(123)  # different init: everything must come from the checkpoint
    b = fp8.convert(Backbone("tiny"), recipe)
    b.load_state_dict(ck["model"])
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
    opt_b.load_state_dict(ck["opt"])
    for x in xs[3:]:
        ya = _step(a, recipe, x, opt_a)
        yb = _step(b, recipe, x, opt_b)
        torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    fp8.update_scales()  # apply both models' last gradient amaxes
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(va, vb, rtol=0, atol=0, msg=k)


def test_plain_checkpoint_loads_into_fp8_model_and_history_length_adapts():
    torch.manual_seed(0)
    plain = Backbone("tiny")
    model = fp8.convert(Backbone("tiny"), DelayedScaling(amax_history_len=4))
    res = model.load_state_dict(plain.state_dict(), strict=True)  # no FP8 keys: fresh scaling state
    assert not res.missing_keys and not res.unexpected_keys
    fc1 = model.layers["0"].layernorm_mlp.fc1
    assert not fc1.fp8_amax_history.any() and torch.equal(fc1.fp8_scale, torch.ones(3))
    sd = model.state_dict()
    sd["layers.0.layernorm_mlp.fc1.fp8_amax_history"] = torch.arange(30.0).view(3, 10)
    model.load_state_dict(sd)
    assert torch.equal(fc1.fp8_amax_history, torch.arange(30.0).view(3, 10)[:, :4])


@pytest.mark.parametrize("name", list(RECIPES))
def test_inference_weights_memory_and_outputs(name):
    recipe = RECIPES[name]
    torch.manual_seed(0)
    bf16 = Backbone("tiny", hidden_size=128, ffn_hidden_size=512, num_attention_heads=4, params_dtype=torch.bfloat16)
    ref = Backbone("tiny", hidden_size=128, ffn_hidden_size=512, num_attention_heads=4)
    ref.load_state_dict({k: v.float() for k, v in bf16.state_dict().items()})
    train_mode = fp8.convert(copy.deepcopy(ref), recipe)
    frozen = fp8.convert(copy.deepcopy(bf16), recipe, inference=True)

    bytes_bf16 = fp8.weight_memory(bf16)
    bytes_fp8 = fp8.weight_memory(frozen)
    ratio = bytes_fp8 / bytes_bf16
    print(f"\n{name}: FP8 inference weights {bytes_fp8} B vs bf16 {bytes_bf16} B = {ratio:.3f}")
    assert ratio <= 0.55
    assert ratio >= 0.5  # codes are one byte: at least half
    fc1 = frozen.layers["0"].layernorm_mlp.fc1
    assert fc1.weight.dtype == torch.float8_e4m3fn and "weight" not in dict(fc1.named_parameters())

    frozen32 = fp8.convert(copy.deepcopy(ref), recipe, inference=True)
    x = torch.randn(1, 24, 128)
    with torch.no_grad():
        y_ref = ref(x)
        with fp8.autocast(recipe=recipe):
            y_train = train_mode(x)
        # stored weights are quantized as the training path quantizes them on its first step
        torch.testing.assert_close(frozen32(x), y_train, rtol=1e-5, atol=1e-5)
        y_inf = frozen(x.bfloat16()).float()  # everything else in bf16
    torch.testing.assert_close(y_inf, y_ref, rtol=0.125, atol=0.0675)

    # the frozen checkpoint round-trips (FP8 codes and scales in the state dict)
    again = fp8.convert(copy.deepcopy(bf16), recipe, inference=True)
    again.load_state_dict(frozen.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(again(x.bfloat16()), frozen(x.bfloat16()), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="inference-only"):
        frozen(x.bfloat16().requires_grad_())
    with pytest.raises(RuntimeError, match="cannot be re-initialised"):
        fc1.reset_parameters()


def test_freeze_helper_counts(caplog):
    """``freeze_fp8_weights`` stores every FP8Linear's weight in FP8 (4 per layer: QKV, projection, FC1,
    FC2), and says how many in its log line."""
    m = fp8.convert(Backbone("tiny"), CurrentScaling())
    linears = [mod for mod in m.modules() if isinstance(mod, FP8Linear)]
    assert len(linears) == 4 * m.config.num_layers
    assert not any(mod.fp8_inference for mod in linears)
    with caplog.at_level("INFO", logger="mmte"):
        fp8.freeze_fp8_weights(m)
    assert all(mod.fp8_inference for mod in linears)
    assert all(mod.weight.dtype == torch.float8_e4m3fn and not isinstance(mod.weight, torch.nn.Parameter) for mod in linears)
    assert f"stored {len(linears)} FP8Linear weights in FP8 for inference" in caplog.text
