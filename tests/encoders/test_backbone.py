"""Backbone: FQNs (API), presets, fused == eager, meta init, input validation."""

import pytest
import torch

from mmte.encoders import Backbone, BackboneConfig, get_preset, list_presets
from tests.reference import naive
from tests.reference.compare import assert_same_forward_backward


def test_fqns_are_stable():
    b = Backbone("tiny", pre_norm=True)
    keys = set(b.state_dict())
    expected_layer = {
        "self_attention.layernorm_qkv.norm.weight", "self_attention.layernorm_qkv.norm.bias",
        "self_attention.layernorm_qkv.linear.weight", "self_attention.layernorm_qkv.linear.bias",
        "self_attention.proj.weight", "self_attention.proj.bias",
        "layernorm_mlp.norm.weight", "layernorm_mlp.norm.bias",
        "layernorm_mlp.fc1.weight", "layernorm_mlp.fc1.bias", "layernorm_mlp.fc2.weight", "layernorm_mlp.fc2.bias",
    }
    expected = {f"layers.{i}.{k}" for i in range(2) for k in expected_layer}
    expected |= {"norm_pre.weight", "norm_pre.bias", "norm.weight", "norm.bias"}
    assert keys == expected
    post = Backbone("tiny", layer_norm_position="post", final_norm=False)
    assert "layers.0.post_attention_layernorm.weight" in post.state_dict()
    assert "layers.0.self_attention.layernorm_qkv.norm.weight" not in post.state_dict()


def test_forward_matches_naive_stack():
    b = Backbone("tiny", num_layers=3).eval()
    with torch.no_grad():
        for p in b.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 9, 64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    sd = b.state_dict()
    ref = x
    for i in range(3):
        p = {k[len(f"layers.{i}."):]: v for k, v in sd.items() if k.startswith(f"layers.{i}.")}
        ref = naive.transformer_layer(ref, p, 4, eps=1e-5, mask=mask)
    ref = naive.layer_norm(ref, sd["norm.weight"], sd["norm.bias"], 1e-5)
    with torch.no_grad():
        torch.testing.assert_close(b(x, mask), ref, rtol=1.3e-6, atol=1e-5)


def test_pipeline_stage_with_missing_parts_runs():
    b = Backbone("tiny", num_layers=4)
    del b.layers["0"], b.layers["1"]
    b.norm = None
    assert b(torch.randn(1, 3, 64)).shape == (1, 3, 64)


def test_fused_equals_eager_forward_and_backward():
    torch.manual_seed(0)
    eager = Backbone("tiny", num_layers=2, drop_path_rate=0.0)
    fused = Backbone("tiny", num_layers=2)
    fused.load_state_dict(eager.state_dict())
    fused.fuse()
    assert fused.fused and all(getattr(layer, "_compiled_call_impl", None) is not None for layer in fused.layers.values())
    assert set(fused.state_dict()) == set(eager.state_dict())  # no _orig_mod prefixes
    x = torch.randn(3, 10, 64)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[0, 7:] = False
    assert_same_forward_backward(eager, fused, x, mask, lambda o: o.pow(2).mean(), fwd_tol=(1e-5, 1e-5), bwd_tol=(1e-5, 1e-5))


def test_meta_device_build_and_materialise():
    b = Backbone("small", device="meta")
    assert all(p.is_meta for p in b.parameters())
    b.to_empty(device="cpu")
    b.reset_parameters()
    out = b(torch.randn(2, 5, 192))
    assert torch.isfinite(out).all()


def test_presets_and_overrides():
    assert {"meta-transformer-b16", "meta-transformer-l14", "tiny", "small", "minilm-l6"} <= set(list_presets())
    assert get_preset("tiny", num_layers=5).num_layers == 5
    with pytest.raises(KeyError, match="unknown backbone preset 'huge'.*tiny"):
        get_preset("huge")
    with pytest.raises(ValueError, match=r"unknown BackboneConfig field\(s\) \['depth'\]"):
        get_preset("tiny", depth=3)
    with pytest.raises(ValueError, match=r"hidden_size \(100\) must be divisible by num_attention_heads \(3\)"):
        BackboneConfig(2, 100, 3)


def test_bad_inputs():
    b = Backbone("tiny")
    with pytest.raises(ValueError, match=r"tokens \[B, N, 64\] \(hidden_size=64\); got shape \(2, 5, 32\)"):
        b(torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match=r"float32 but tokens are torch.float64"):
        b(torch.randn(2, 5, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"padding mask must be bool \[B, N\] = \(2, 5\).*\(2, 6\)"):
        b(torch.randn(2, 5, 64), torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="backend must be one of"):
        Backbone("tiny", backend="jax")


def test_bf16_autocast_is_accepted():
    b = Backbone("tiny")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = b(torch.randn(1, 4, 64))
    assert out.shape == (1, 4, 64) and torch.isfinite(out).all()
