"""mmte.te modules against the naive references in tests/reference (forward and backward, fp32)."""

import pytest
import torch

from mmte import te
from tests.reference import naive

RTOL, ATOL = 1.3e-6, 1e-5  # TE's fp32 tolerances


def _randomize(module, std=0.3):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, std)
    return module


def _check(module, ref_fn, inputs, atol=ATOL, rtol=RTOL):
    """Compare module(*inputs) with ref_fn(params, *inputs), and all gradients."""
    inputs = [i.clone().requires_grad_(i.is_floating_point()) if isinstance(i, torch.Tensor) else i for i in inputs]
    out = module(*inputs)
    grad = torch.randn_like(out)
    out.backward(grad)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in module.named_parameters()}
    ref_inputs = [i.detach().clone().requires_grad_(i.is_floating_point()) if isinstance(i, torch.Tensor) else i for i in inputs]
    ref = ref_fn(params, *ref_inputs)
    ref.backward(grad)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    for a, b in zip(inputs, ref_inputs):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol)
    for k, p in module.named_parameters():
        torch.testing.assert_close(p.grad, params[k].grad, rtol=rtol, atol=atol, msg=lambda m, k=k: f"grad of {k}: {m}")


@pytest.mark.parametrize("zero_centered", [False, True])
def test_layer_norm(zero_centered):
    m = _randomize(te.LayerNorm(48, eps=1e-6, zero_centered_gamma=zero_centered))
    off = 1.0 if zero_centered else 0.0
    _check(m, lambda p, x: naive.layer_norm(x, p["weight"] + off, p["bias"], 1e-6), [torch.randn(3, 5, 48) * 2 + 1])


def test_rms_norm():
    m = _randomize(te.RMSNorm(40, eps=1e-5))
    _check(m, lambda p, x: naive.rms_norm(x, p["weight"], 1e-5), [torch.randn(2, 7, 40)])


def test_linear_and_init_method():
    m = _randomize(te.Linear(32, 24))
    _check(m, lambda p, x: naive.linear(x, p["weight"], p["bias"]), [torch.randn(4, 6, 32)])
    m2 = te.Linear(8, 8, init_method=lambda w: torch.nn.init.constant_(w, 0.5))
    assert torch.all(m2.weight == 0.5) and torch.all(m2.bias == 0)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm", None])
def test_layernorm_linear(normalization):
    m = _randomize(te.LayerNormLinear(32, 48, eps=1e-5, normalization=normalization))

    def ref(p, x):
        if normalization == "LayerNorm":
            x = naive.layer_norm(x, p["norm.weight"], p["norm.bias"], 1e-5)
        elif normalization == "RMSNorm":
            x = naive.rms_norm(x, p["norm.weight"], 1e-5)
        return naive.linear(x, p["linear.weight"], p["linear.bias"])

    _check(m, ref, [torch.randn(2, 9, 32)])


def test_layernorm_linear_returns_norm_output():
    m = te.LayerNormLinear(16, 8, return_layernorm_output=True)
    x = torch.randn(2, 3, 16)
    out, h = m(x)
    torch.testing.assert_close(h, naive.layer_norm(x, m.norm.weight, m.norm.bias, 1e-5), rtol=RTOL, atol=ATOL)
    assert out.shape == (2, 3, 8)


@pytest.mark.parametrize("activation", te.ACTIVATIONS)
def test_layernorm_mlp(activation):
    m = _randomize(te.LayerNormMLP(32, 64, eps=1e-5, activation=activation), std=0.2)
    assert (m.up is not None) == (activation in ("swiglu", "geglu"))

    def ref(p, x):
        h = naive.layer_norm(x, p["norm.weight"], p["norm.bias"], 1e-5)
        if activation == "geglu":
            a = naive.act("gelu", naive.linear(h, p["fc1.weight"], p["fc1.bias"])) * naive.linear(h, p["up.weight"], p["up.bias"])
            return naive.linear(a, p["fc2.weight"], p["fc2.bias"])
        return naive.mlp(h, p, activation, prefix="")

    _check(m, ref, [torch.randn(2, 5, 32)])


@pytest.mark.parametrize("mask_type", ["no_mask", "padding", "causal", "padding_causal"])
def test_dot_product_attention(mask_type):
    m = te.DotProductAttention(4, 8, attn_mask_type=mask_type)
    b, n = 3, 7
    q, k, v = (torch.randn(b, n, 4, 8) for _ in range(3))
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    use_mask = mask if "padding" in mask_type else None
    causal = "causal" in mask_type

    def ref(p, q, k, v, mk):
        o = naive.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mk, causal)
        return o.transpose(1, 2).reshape(b, n, -1)

    out = m(q, k, v, use_mask)
    torch.testing.assert_close(out, ref({}, q, k, v, use_mask), rtol=RTOL, atol=ATOL)


def test_attention_backward_with_padding():
    m = _randomize(te.MultiheadAttention(32, 4, attn_mask_type="padding"))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 3:] = False

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = m

        def forward(self, x):
            return self.inner(x, mask)

    def ref(p, x):
        p = {k.removeprefix("inner."): v for k, v in p.items()}
        h = naive.layer_norm(x, p["layernorm_qkv.norm.weight"], p["layernorm_qkv.norm.bias"], 1e-5)
        return naive.mha(h, p, 4, mask, prefix="")

    _check(Wrap(), ref, [torch.randn(2, 6, 32)])


CASES = [
    {"position": "pre", "activation": "gelu", "kind": "LayerNorm", "ls": None, "masked": False},
    {"position": "pre", "activation": "quick_gelu", "kind": "LayerNorm", "ls": 0.5, "masked": True},
    {"position": "post", "activation": "gelu", "kind": "LayerNorm", "ls": None, "masked": True},
    {"position": "pre", "activation": "swiglu", "kind": "RMSNorm", "ls": None, "masked": True},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_transformer_layer(case):
    eps = 1e-6
    layer = te.TransformerLayer(
        48, 96, 4, eps, normalization=case["kind"], activation=case["activation"], layer_norm_position=case["position"],
        layer_scale_init=case["ls"],
    )
    _randomize(layer, std=0.15)
    layer.eval()
    mask = None
    if case["masked"]:
        mask = torch.ones(3, 10, dtype=torch.bool)
        mask[0, 6:] = False
        mask[2, 2:] = False

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x, mask)

    def ref(p, x):
        p = {k.removeprefix("layer."): v for k, v in p.items()}
        return naive.transformer_layer(x, p, 4, eps=eps, activation=case["activation"], position=case["position"], mask=mask, kind=case["kind"])

    _check(Wrap(), ref, [torch.randn(3, 10, 48)])


def test_drop_path_and_dropout_only_in_training():
    layer = te.TransformerLayer(16, 32, 2, hidden_dropout=0.5, attention_dropout=0.5, drop_path_rate=0.5)
    x = torch.randn(8, 4, 16)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
    layer.train()
    torch.manual_seed(1)
    a = layer(x)
    torch.manual_seed(2)
    b = layer(x)
    assert not torch.allclose(a, b)
    dp = te.DropPath(0.5).train()
    y = dp(torch.ones(1000, 3))
    kept = (y[:, 0] != 0).float()
    assert torch.all((y == 0) | (y == 2.0))  # survivors scaled by 1/(1-p)
    assert 0.4 < kept.mean() < 0.6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_meta_init_and_reset_parameters(dtype):
    layer = te.TransformerLayer(32, 64, 4, params_dtype=dtype, device="meta", layer_scale_init=0.1, activation="swiglu")
    assert all(p.device.type == "meta" and p.dtype == dtype for p in layer.parameters())
    layer.to_empty(device="cpu")
    for m in layer.modules():
        if m is not layer and hasattr(m, "reset_parameters"):
            m.reset_parameters()
    assert all(torch.isfinite(p).all() for p in layer.parameters())
    assert torch.all(layer.ls1.gamma == 0.1)
    assert torch.all(layer.self_attention.layernorm_qkv.norm.weight == 1)
    out = layer(torch.randn(2, 3, 32, dtype=dtype))
    assert out.dtype == dtype and torch.isfinite(out).all()


def test_bad_inputs_name_shapes():
    layer = te.TransformerLayer(32, 64, 4)
    with pytest.raises(ValueError, match=r"\[B, N, 32\].*\(2, 3, 16\)"):
        layer(torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match=r"padding mask must have shape \(B, N\) = \(2, 3\); got \(2, 4\)"):
        layer(torch.randn(2, 3, 32), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        layer(torch.randn(2, 3, 32), torch.ones(2, 3))
    with pytest.raises(ValueError, match="divisible by num_attention_heads"):
        te.TransformerLayer(30, 64, 4)
    with pytest.raises(ValueError, match="activation must be one of"):
        te.LayerNormMLP(8, 16, activation="mish")
    with pytest.raises(ValueError, match="layer_norm_position"):
        te.TransformerLayer(8, 16, 2, layer_norm_position="middle")
    with pytest.raises(ValueError, match="attn_mask_type"):
        te.DotProductAttention(2, 4, attn_mask_type="sliding")


def test_forced_sdpa_backend_math_matches_default():
    q, k, v = (torch.randn(2, 5, 2, 8) for _ in range(3))
    a = te.DotProductAttention(2, 8)(q, k, v)
    b = te.DotProductAttention(2, 8, backend="math")(q, k, v)
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
