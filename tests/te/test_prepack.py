"""CPU weight prepacking (mmte.te.prepack): packed GEMMs against F.linear in fp32 (a naive reference)
and bf16, used only without autograd, invalidated by weight changes, safe to copy and pickle, and
applied by the inference path of the real quickstart model."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmte.te import Linear
from mmte.te.prepack import available, pack, unpack
from tests.te.test_lowp import OpLog

ROOT = Path(__file__).resolve().parents[2]
BF16 = torch.bfloat16

needs_fp32 = pytest.mark.skipif(not available(torch.float32), reason="this torch build has no oneDNN weight prepacking")


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
    batch = {k: v for k, v in dm._collate([ds[i] for i in range(6)]).items() if k == "image"}
    with torch.no_grad():
        ref = model(batch)["digit"]
    dtype = "bf16" if available(BF16) else "fp32"
    inf = optimize(model, dtype)
    n_gemms = 4 * model.backbone.config.num_layers
    assert sum(getattr(m, "_mmte_prepack", None) is not None for m in inf.modules()) == n_gemms
    out = inf(batch)["digit"]
    assert ((out - ref).norm() / ref.norm()).item() < (2e-2 if dtype == "bf16" else 1e-5)
    unpacked = optimize(model, dtype, prepack=False)(batch)["digit"]
    assert ((out - unpacked).norm() / unpacked.norm()).item() < (1e-2 if dtype == "bf16" else 1e-5)
