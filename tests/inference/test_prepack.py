"""CPU weight prepacking (mmte.inference: PackedLinear, PackedTransformerLayer, pack): packed GEMMs against F.linear in fp32 (a naive reference)
and bf16, used only without autograd, invalidated by weight changes, safe to copy and pickle; the
small-row path (fp32 inputs on fp16-packed bf16 weights) against a float64 reference; a transformer
layer's flat packed forward against its module path; and the inference path of the real quickstart model."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmte.data import collate_batch
from mmte.inference import SMALL_ROWS, PackedLinear, PackedTransformerLayer, available, pack, small_available, unpack
from mmte.te import Linear, TransformerLayer
from tests.op_log import OpLog

ROOT = Path(__file__).resolve().parents[2]
BF16 = torch.bfloat16

needs_fp32 = pytest.mark.skipif(not available(torch.float32), reason="this torch build has no oneDNN weight prepacking")
needs_bf16 = pytest.mark.skipif(not available(BF16), reason="no native bf16 GEMMs on this CPU (prepacking bf16 is refused)")
needs_small = pytest.mark.skipif(not small_available(), reason="this torch build has no fbgemm fp16-weight GEMM")


def _lin(dtype=torch.float32, k=48, n=40) -> Linear:
    torch.manual_seed(0)
    return Linear(k, n).to(dtype).requires_grad_(False)


def _ops(fn) -> list[str]:
    """The aten op names ``fn`` runs (``_linear_pointwise`` for a packed GEMM, ``addmm`` for F.linear)."""
    with OpLog() as log:
        fn()
    return [name for name, _, _ in log.ops]


@needs_fp32
@pytest.mark.parametrize("rows", [1, 5, 197])
def test_packed_fp32_gemm_matches_naive_reference(rows):
    lin = _lin()
    assert pack(lin, rows=rows) == 1
    x = torch.randn(2, rows, 48)
    with torch.inference_mode():
        out = lin(x)
        names = _ops(lambda: lin(x))
    ref = (x.double() @ lin.weight.double().T + lin.bias.double()).float()
    assert out.shape == (2, rows, 40)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert "_linear_pointwise" in names and "addmm" not in names


@pytest.mark.skipif(not available(BF16), reason="no native bf16 GEMMs on this CPU (prepacking bf16 is refused)")
def test_packed_bf16_gemm_matches_f_linear_in_bf16():
    lin = _lin(BF16, 384, 1536)
    x = torch.randn(5, 384, dtype=BF16)
    with torch.inference_mode():
        ref = F.linear(x, lin.weight, lin.bias)
        pack(lin)
        out = lin(x)
    assert out.dtype == BF16
    # the same bf16 inputs and fp32 accumulation; only the summation order may differ
    assert (out.float() - ref.float()).abs().max().item() <= 2 ** -7 * ref.float().abs().max().item()


@needs_fp32
def test_packed_path_stays_out_of_autograd_and_other_dtypes():
    lin = _lin()
    pack(lin)
    x = torch.randn(3, 48, requires_grad=True)
    y = lin(x)  # grad mode on: the plain GEMM, whose backward reaches the input
    y.sum().backward()
    torch.testing.assert_close(x.grad, lin.weight.sum(0).expand(3, -1))
    with torch.no_grad():
        assert any("_linear_pointwise" in n for n in _ops(lambda: lin(x.detach())))  # no autograd: packed
        y16 = lin(x.detach().to(BF16))  # another dtype than the weight's: the bf16 path of F.linear
        assert y16.dtype == BF16 and not any("_linear_pointwise" in n for n in _ops(lambda: lin(x.detach().to(BF16))))
    trainable = Linear(8, 4)
    assert pack(trainable) == 0  # a trained weight is never packed


@needs_fp32
def test_weight_changes_repack():
    lin = _lin()
    pack(lin)
    x = torch.randn(4, 48)
    with torch.inference_mode():
        first = lin(x)
    new_w, new_b = torch.randn(40, 48), torch.randn(40)
    lin.load_state_dict({"weight": new_w, "bias": new_b})
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, new_w, new_b), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        lin.weight.mul_(2)
        torch.testing.assert_close(lin(x), F.linear(x, 2 * new_w, new_b), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(first, lin(x).detach())
    assert unpack(lin) == 1
    with torch.no_grad():
        assert not any("_linear_pointwise" in n for n in _ops(lambda: lin(x)))


@needs_fp32
def test_copies_and_pickles_repack_on_first_use():
    lin = _lin()
    pack(lin)
    x = torch.randn(4, 48)
    with torch.inference_mode():
        ref = lin(x)
    for other in (copy.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
        with torch.inference_mode():
            torch.testing.assert_close(other(x), ref, rtol=0, atol=0)
            assert any("_linear_pointwise" in n for n in _ops(lambda o=other: o(x)))


@needs_fp32
def test_inference_path_of_the_quickstart_model_prepacks_its_backbone():
    from mmte.cli import MMTECLI
    from mmte.inference import optimize

    cli = MMTECLI(args=["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(ROOT / "configs" / "encoders" / "tiny.yaml"),
                        "--trainer.logger", "false"], run=False)
    module, dm = cli.model, cli.datamodule
    module.configure_model()
    dm.setup("predict")
    model = module.model.eval()
    ds = dm.datasets[dm.predict_split]
    batch = {k: v for k, v in collate_batch([ds[i] for i in range(6)], dm.collates_for("eval")).items() if k == "image"}
    with torch.no_grad():
        ref = model(batch)["digit"]
    dtype = "bf16" if available(BF16) else "fp32"
    inf = optimize(model, dtype)
    n_gemms = 4 * model.backbone.config.num_layers
    assert sum(isinstance(m, PackedLinear) for m in inf.modules()) == n_gemms
    assert sum(isinstance(m, PackedTransformerLayer) for m in inf.modules()) == model.backbone.config.num_layers
    out = inf(batch)["digit"]
    assert ((out - ref).norm() / ref.norm()).item() < (2e-2 if dtype == "bf16" else 1e-5)
    unpacked = optimize(model, dtype, prepack=False)(batch)["digit"]
    assert ((out - unpacked).norm() / unpacked.norm()).item() < (1e-2 if dtype == "bf16" else 1e-5)


# ------------------------------------------------------------------------------ small-row path
@needs_bf16
@needs_small
def test_small_rows_run_fp32_on_fp16_packed_bf16_weights():
    lin = _lin(BF16, 384, 1152)
    pack(lin)
    x = torch.randn(2, 384)
    with torch.inference_mode():
        out = lin(x)
        names = _ops(lambda: lin(x))
    # every bf16 weight in this range is exactly an fp16 number: the result is the fp32 GEMM on those weights
    ref = (x.double() @ lin.weight.double().T + lin.bias.double()).float()
    assert out.dtype == torch.float32
    # fp32 accumulation over 384 products: within 1e-5 of the largest output
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert "fbgemm_linear_fp16_weight_fp32_activation" in names and "addmm" not in names
    new_w = torch.randn(1152, 384).to(BF16)
    lin.load_state_dict({"weight": new_w, "bias": torch.zeros(1152, dtype=BF16)})
    with torch.inference_mode():
        ref = (x.double() @ new_w.double().T).float()
        torch.testing.assert_close(lin(x), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def _layer(kind: str) -> TransformerLayer:
    torch.manual_seed(0)
    kw = {
        "pre-gelu": {},
        "post-gelu": {"layer_norm_position": "post"},
        "pre-swiglu-ls": {"activation": "swiglu", "layer_scale_init": 0.5, "normalization": "RMSNorm"},
        "pre-quick_gelu-causal": {"activation": "quick_gelu", "self_attn_mask_type": "causal"},
    }[kind]
    layer = TransformerLayer(64, 128, 4, **kw).eval().requires_grad_(False)
    with torch.no_grad():  # non-trivial norms and biases
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def _packed_ops(layer, *args) -> list[str]:
    with torch.inference_mode():
        return [n for n in _ops(lambda: layer(*args)) if n in ("_linear_pointwise", "addmm", "mm", "fbgemm_linear_fp16_weight_fp32_activation")]


@needs_fp32
@pytest.mark.parametrize("kind", ["pre-gelu", "post-gelu", "pre-swiglu-ls", "pre-quick_gelu-causal"])
@pytest.mark.parametrize("masked", [False, True])
def test_packed_layer_forward_matches_its_module_path(kind, masked):
    layer = _layer(kind)
    x = torch.randn(3, 7, 64)
    mask = torch.tensor([[True] * 7, [True] * 5 + [False] * 2, [True] * 3 + [False] * 4]) if masked else None
    with torch.inference_mode():
        ref = layer(x, mask)
    n_gemms = pack(layer, rows=21)
    assert n_gemms == (5 if "swiglu" in kind else 4)
    with torch.inference_mode():
        out = layer(x, mask)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)  # fp32: only the GEMMs' summation order differs
    assert _packed_ops(layer, x, mask) == ["_linear_pointwise"] * n_gemms
    with torch.no_grad():  # autograd off but not inference mode: the same packed path
        torch.testing.assert_close(layer(x, mask), ref, rtol=1e-5, atol=1e-5)
    out_grad = layer(x, mask)  # grad mode on: the module path
    torch.testing.assert_close(out_grad, ref, rtol=1e-5, atol=1e-5)


@needs_bf16
@needs_small
@pytest.mark.parametrize("kind", ["pre-gelu", "post-gelu", "pre-swiglu-ls"])
def test_packed_bf16_layer_and_its_small_row_path(kind):
    layer = _layer(kind)
    x = torch.randn(1, 2, 64)  # one item of two tokens: 2 rows
    bf = copy.deepcopy(layer).to(BF16)
    for m in bf.modules():  # as mmte.inference.optimize leaves them: norms and layer scales in fp32
        if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(m).__name__ == "LayerScale":
            m.float()
    exact = copy.deepcopy(bf).float()  # the bf16 weights in fp32: what the small-row path computes on
    with torch.inference_mode():
        ref, ref_exact = layer(x), exact(x)
        unpacked_bf16 = bf(x.to(BF16)).float()
    pack(bf, rows=SMALL_ROWS)
    with torch.inference_mode():
        small = bf(x)  # fp32 input on bf16 weights: fp16-packed GEMMs, fp32 activations
        packed_bf16 = bf(x.to(BF16)).float()  # bf16 input: the oneDNN-packed bf16 GEMMs
    assert small.dtype == torch.float32
    torch.testing.assert_close(small, ref_exact, rtol=1e-5, atol=1e-5)
    n_gemms = 5 if "swiglu" in kind else 4
    assert _packed_ops(bf, x) == ["fbgemm_linear_fp16_weight_fp32_activation"] * n_gemms
    assert _packed_ops(bf, x.to(BF16)) == ["_linear_pointwise"] * n_gemms
    # both bf16 paths sit within bf16 rounding of the fp32 layer, and the small-row path is closer
    def rel(a):
        return ((a - ref).norm() / ref.norm()).item()
    assert rel(packed_bf16) < 2e-2 and rel(unpacked_bf16) < 2e-2
    assert rel(small) < rel(packed_bf16)


@needs_bf16
@needs_small
def test_quickstart_inference_runs_one_item_on_the_small_row_path():
    from mmte.cli import MMTECLI
    from mmte.inference import optimize

    cli = MMTECLI(args=["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.logger", "false"], run=False)
    module, dm = cli.model, cli.datamodule
    module.configure_model()
    dm.setup("predict")
    model = module.model.eval()
    ds = dm.datasets[dm.predict_split]
    n_gemms = 4 * model.backbone.config.num_layers
    inf = optimize(model, "bf16")
    assert inf.model.backbone.small_rows == SMALL_ROWS
    for i in range(3):  # one digit = one image token + cls: 2 rows
        one = {k: v for k, v in collate_batch([ds[i]], dm.collates_for("eval")).items() if k == "image"}
        with torch.no_grad():
            ref = model(one)["digit"]
        out = inf(one)["digit"]
        assert _packed_ops(inf, one).count("fbgemm_linear_fp16_weight_fp32_activation") == n_gemms
        inf.model.backbone.small_rows = 0  # the same item through the packed bf16 GEMMs
        out_bf16 = inf(one)["digit"]
        assert _packed_ops(inf, one).count("_linear_pointwise") == n_gemms
        inf.model.backbone.small_rows = SMALL_ROWS
        err, err_bf16 = (((o - ref).norm() / ref.norm()).item() for o in (out, out_bf16))
        assert err < 1e-2 and err < err_bf16, (err, err_bf16)


@needs_fp32
def test_packed_layer_keeps_lora_adapters():
    """LoRA attaches to a Linear by a forward hook: a packed layer must not run that GEMM around it."""
    from mmte.lora import apply_lora

    layer = _layer("pre-gelu")
    stack = torch.nn.ModuleDict({"layers": torch.nn.ModuleDict({"0": layer})})
    apply_lora(stack, rank=4, targets=["layers.*.self_attention.proj", "layers.*.layernorm_mlp.fc1"])
    with torch.no_grad():
        for m in layer.modules():
            if hasattr(m, "B") and hasattr(m, "A"):
                m.B.normal_()  # a trained adapter: B is no longer zero
    layer.requires_grad_(False)
    x = torch.randn(2, 5, 64)
    with torch.inference_mode():
        ref = layer(x)
    assert pack(layer) == 4  # the adapters' A and B are parameters of the LoRA module, not GEMM modules
    with torch.inference_mode():
        out = layer(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ref, _layer("pre-gelu")(x))  # the adapters change the output


@needs_fp32
def test_parametrized_weight_takes_the_plain_path():
    """A parametrized weight is computed on access (not in ``_parameters``): never served from a stale packing."""
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    lin = _lin()
    parametrize.register_parametrization(lin, "weight", Double())
    lin.requires_grad_(False)
    pack(lin)
    x = torch.randn(3, 48)
    with torch.inference_mode():
        out = lin(x)
        names = _ops(lambda: lin(x))
    torch.testing.assert_close(out, F.linear(x, 2 * lin.parametrizations.weight.original, lin.bias), rtol=1e-5, atol=1e-5)
    assert "_linear_pointwise" not in names


@needs_bf16
@needs_small
def test_small_row_packing_follows_a_replaced_weight():
    """The small-row packing is reused while the same weight tensor is unchanged; in-place edits and a
    replaced ``.data`` (what ``Module.to`` does) repack."""
    lin = _lin(BF16)
    pack(lin, rows=SMALL_ROWS)
    x = torch.randn(2, 48)

    def ref():
        return F.linear(x.double(), lin.weight.double(), lin.bias.double()).float()

    with torch.inference_mode():
        torch.testing.assert_close(lin(x), ref(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lin(x), ref(), rtol=1e-5, atol=1e-5)  # the reused packing
    with torch.no_grad():
        lin.weight.mul_(-1)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), ref(), rtol=1e-5, atol=1e-5)
    lin.weight.data = torch.randn(40, 48).to(BF16)
    lin.bias.data = torch.randn(40).to(BF16)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), ref(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_apply_norm_is_the_norm_call(kind, zero_centered):
    """The flat layer's functional norm equals the module call, and a hooked norm runs through its call."""
    from mmte.inference import apply_norm
    from mmte.te import make_norm

    norm = make_norm(kind, 16, 1e-5, zero_centered_gamma=zero_centered)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(3, 16)
    torch.testing.assert_close(apply_norm(norm, x), norm(x), rtol=0, atol=0)
    if kind == "LayerNorm":  # the CPU kernel's mixed case: bf16 input, fp32 gamma, as the module
        torch.testing.assert_close(apply_norm(norm, x.to(BF16)), norm(x.to(BF16)), rtol=0, atol=0)
    seen = []
    norm.register_forward_hook(lambda m, i, o: seen.append(o) or o * 2)
    torch.testing.assert_close(apply_norm(norm, x), 2 * seen[-1])
    assert len(seen) == 1


@needs_bf16
@needs_small
def test_small_row_backbone_runs_on_one_thread():
    """fbgemm's kernel is single-threaded and the rest is too small to split: the small-row path runs the
    backbone with one intra-op thread and restores the caller's count; larger inputs keep it."""
    from mmte.encoders import Backbone
    from mmte.inference import optimize

    torch.manual_seed(0)
    bb = Backbone("tiny").eval()
    inf = optimize(bb, "bf16")
    assert inf.model.small_rows == SMALL_ROWS
    seen = []
    inf.model.layers["0"].register_forward_pre_hook(lambda m, a: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        small, large = torch.randn(1, 2, bb.config.hidden_size), torch.randn(4, 8, bb.config.hidden_size)
        with torch.no_grad():
            ref = bb(small)
        torch.testing.assert_close(inf(small), ref, rtol=2e-2, atol=2e-2)
        assert seen == [1] and torch.get_num_threads() == 2
        inf(large)
        assert seen == [1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_one_thread_from_several_python_threads_restores_the_count():
    """The thread count is process-wide: overlapping callers on several Python threads (a threaded
    server) each keep one thread for as long as they are inside, also after another caller left (a
    save/restore per call would hand the second its two threads back mid-call), and the caller's count
    comes back when the last one leaves."""
    import threading

    from mmte.te import one_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    inside, first_in, first_may_leave = [], threading.Event(), threading.Event()

    def first():
        with one_thread():
            inside.append(("first", torch.get_num_threads()))
            first_in.set()
            first_may_leave.wait(30)

    def second():
        first_in.wait(30)
        with one_thread():
            inside.append(("second", torch.get_num_threads()))
            first_may_leave.set()
            threads[0].join(30)  # the first has left; the second is still inside
            inside.append(("second, alone", torch.get_num_threads()))

    try:
        threads = [threading.Thread(target=f) for f in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert inside == [("first", 1), ("second", 1), ("second, alone", 1)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@needs_fp32
def test_packed_layer_honours_global_module_hooks():
    """A globally registered forward hook expects every module's call: the flat layer then runs its modules."""
    from torch.nn.modules.module import register_module_forward_hook

    layer = _layer("pre-gelu")
    pack(layer)
    x = torch.randn(2, 5, 64)
    called = []
    handle = register_module_forward_hook(lambda m, i, o: called.append(type(m).__name__))
    try:
        with torch.inference_mode():
            out = layer(x)
    finally:
        handle.remove()
    assert called.count("PackedLinear") == 4 and "LayerNorm" in called
    with torch.inference_mode():
        torch.testing.assert_close(out, layer(x), rtol=1e-5, atol=1e-5)


@needs_bf16
@pytest.mark.parametrize("kind", ["pre-gelu", "post-gelu"])
def test_packed_bf16_layer_at_many_rows_matches_its_module_path(kind):
    """At ViT-like sizes (batch x heads x tokens >= 512) the flat bf16 layer runs its attention as two
    batched GEMMs on one contiguous copy of q, k, v: the same values as the module path's."""
    layer = _layer(kind).to(BF16)
    for m in layer.modules():
        if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
            m.float()
    x = torch.randn(2, 80, 64).to(BF16)  # 2 x 4 heads x 80 tokens = 640 query rows
    with torch.inference_mode():
        ref = layer(x)
    pack(layer, rows=160)
    with torch.inference_mode(), OpLog() as log:
        out = layer(x)
    names = [n for n, _, _ in log.ops]
    assert names.count("_linear_pointwise") == 4 and names.count("matmul") == 2 and names.count("contiguous") == 1
    assert "scaled_dot_product_attention" not in names
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 5e-3
