"""Recipes: validation, and the delayed-scaling update followed step by step on scripted amax sequences."""

import dataclasses
import math

import pytest
import torch

from mmte import fp8
from mmte.fp8 import MXFP8, BlockScaling, CurrentScaling, DelayedScaling, Format, FP8Linear, delayed_scale, make_recipe

from . import reference as ref


def _ref_updates(seq, length, algo, margin, fp8_max):
    """Pure-Python delayed scaling: (history after the step, scale after the step) for each amax. An amax that
    is 0 or not finite is skipped: history and scale stay as they were."""
    hist, scale, out = [0.0] * length, 1.0, []
    for a in seq:
        if math.isfinite(a) and a > 0:
            hist = [a] + hist[:-1]
            am = hist[0] if algo == "most_recent" else max(hist)
            if math.isfinite(fp8_max / am):
                scale = fp8_max / am / 2.0**margin
        out.append((list(hist), scale))
    return out


def _probe(a: float) -> torch.Tensor:
    """[16, 16] input whose amax is ``a`` (one non-zero entry)."""
    x = torch.zeros(16, 16)
    x[0, 0] = a
    return x


def _identity_linear(recipe):
    lin = FP8Linear(16, 16, bias=False, recipe=recipe)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(16))
    return lin


@pytest.mark.parametrize("algo,margin", [("max", 0), ("most_recent", 0), ("max", 1)])
def test_delayed_update_step_by_step(algo, margin):
    recipe = DelayedScaling(amax_history_len=3, amax_compute_algo=algo, margin=margin)
    lin = _identity_linear(recipe)
    seq = [1.0, 2.0, 0.0, math.inf, 0.5, 0.25, 0.1, math.nan, 3.0, 0.2]
    expected = _ref_updates(seq, 3, algo, margin, 448.0)
    prev_scale = None
    for t, a in enumerate(seq):
        x = _probe(a).requires_grad_(False)
        with fp8.autocast(recipe=recipe):
            y = lin(x)
        # the forward quantized with the *previous* step's scale (just in time at the first step)
        s = (448.0 / a / 2.0**margin) if prev_scale is None else prev_scale
        if math.isnan(a):
            assert math.isnan(y[0, 0].item())
        else:
            want = ref.round_saturate(a * s, "E4M3") / s
            assert y[0, 0].item() == pytest.approx(want, rel=1e-6), (t, a)
        hist, scale = expected[t]
        got_hist = lin.fp8_amax_history[0].tolist()
        assert got_hist == pytest.approx(hist, rel=1e-6), (t, got_hist, hist)  # never NaN/inf: bad amaxes are skipped
        assert lin.fp8_scale[0].item() == pytest.approx(scale, rel=1e-6), (t, a)
        prev_scale = lin.fp8_scale[0].item()
    # the weight role saw amax 1 every step
    assert lin.fp8_scale[1].item() == pytest.approx(448.0 / 2.0**margin)


def test_stale_scale_saturates():
    recipe = DelayedScaling(amax_history_len=2, amax_compute_algo="most_recent")
    lin = _identity_linear(recipe)
    for a, want in [(1.0, 1.0), (2.0, 1.0), (2.0, 2.0)]:  # step 2 uses scale 448 from step 1: 2 -> 448/448
        with fp8.autocast(recipe=recipe):
            y = lin(_probe(a))
        assert y[0, 0].item() == want


def test_gradient_role_updates_at_next_region_and_accumulates_calls():
    recipe = DelayedScaling(amax_history_len=4)
    lin = _identity_linear(recipe)
    gseq = [0.01, 0.02, 1e-5]
    for t, g in enumerate(gseq):
        x = torch.randn(16, 16, requires_grad=True)
        with fp8.autocast(recipe=recipe):
            y1 = lin(x)
            y2 = lin(2 * x)  # second call in the same step: its larger amax must be recorded
        amax_in = (2 * x).abs().max().item()
        assert lin.fp8_amax_history[0, 0].item() == pytest.approx(amax_in, rel=1e-6)
        gy = torch.zeros(16, 16)
        gy[3, 4] = g
        (y1 * gy).sum().backward(retain_graph=True)
        (y2 * gy * 0.5).sum().backward()
        assert lin.fp8_amax_pending[2].item() == pytest.approx(g, rel=1e-6)
        fp8.update_scales()
    hist = [v for v in lin.fp8_amax_history[2].tolist()]
    assert hist == pytest.approx([1e-5, 0.02, 0.01, 0.0], rel=1e-6)
    assert lin.fp8_scale[2].item() == pytest.approx(57344.0 / 0.02, rel=1e-6)


def test_delayed_scale_formula_function():
    h = torch.tensor([[0.5, 4.0, 0.0], [0.0, 0.0, 0.0], [math.inf, 1.0, 1.0], [2.0, 8.0, 1.0]])
    old = torch.tensor([3.0, 5.0, 7.0, 11.0])
    got = delayed_scale(h, old, 448.0, margin=2, algo="max")
    assert got.tolist() == [448.0 / 4.0 / 4.0, 5.0, 7.0, 448.0 / 8.0 / 4.0]
    got = delayed_scale(h, old, 448.0, margin=0, algo="most_recent")
    assert got.tolist() == [448.0 / 0.5, 5.0, 7.0, 448.0 / 2.0]


def test_recipe_validation_and_names():
    assert make_recipe("delayed", amax_history_len=16).amax_history_len == 16
    assert isinstance(make_recipe("mx"), MXFP8) and isinstance(make_recipe("block"), BlockScaling)
    assert make_recipe("current", fp8_format="E4M3").fp8_format is Format.E4M3
    with pytest.raises(ValueError, match=r"no field\(s\) \['tile'\]"):
        make_recipe("delayed", tile=64)
    with pytest.raises(ValueError, match="recipe must be one of"):
        make_recipe("fp4")
    with pytest.raises(ValueError, match="amax_compute_algo must be 'max' or 'most_recent'; got 'mean'"):
        DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="amax_history_len must be an int >= 1; got 0"):
        DelayedScaling(amax_history_len=0)
    with pytest.raises(ValueError, match="gemm must be one of"):
        CurrentScaling(gemm="cublas")
    with pytest.raises(ValueError, match="scale_rounding"):
        MXFP8(scale_rounding="nearest")
    r = DelayedScaling()
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'margin'"):
        r.margin = 3  # frozen
    assert hash(r) == hash(DelayedScaling())


def test_te_recipe_delegation():
    ok, _why = fp8.is_available("cpu", DelayedScaling())
    assert ok
    from mmte.te import te_available

    have_te, reason = te_available()
    if not have_te:
        with pytest.raises(RuntimeError, match="needs TransformerEngine"):
            fp8.to_te_recipe(DelayedScaling())
        pytest.skip(f"transformer_engine not installed: {reason}")
    te_r = fp8.to_te_recipe(DelayedScaling(amax_history_len=8))  # pragma: no cover - needs TE
    assert te_r.amax_history_len == 8  # pragma: no cover


def test_bad_amax_keeps_scale_counts_logs_once_and_stops_after_n(caplog):
    """A scripted amax sequence: one NaN no longer freezes the scale for amax_history_len steps (it never
    enters the history), zeros and infs keep the previous scale and are counted, one warning is logged, and
    the Nth consecutive non-finite update raises RunError naming the tensor."""
    import logging

    from mmte.errors import RunError
    from mmte.fp8.linear import reset_bad_amax_log

    reset_bad_amax_log()  # an earlier test in this process may have logged one already
    recipe = DelayedScaling(amax_history_len=1024, max_bad_amax_steps=3)
    lin = _identity_linear(recipe)
    seq = [2.0, math.nan, 4.0, 0.0, math.inf, math.nan, 1.0, math.inf, math.nan]
    scales = []
    with caplog.at_level(logging.INFO, logger="mmte.fp8.linear"):
        for a in seq[:-1]:
            with fp8.autocast(recipe=recipe):
                lin(_probe(a))
            scales.append(lin.fp8_scale[0].item())
        # 2 -> 224; NaN kept; 4 -> max(4, 2) = 4 -> 112 (TE-style history would be NaN here for 1024 steps);
        # 0, inf, NaN kept; 1 -> max(1, 4, 2) = 4 -> 112; inf kept
        assert scales == pytest.approx([224.0, 224.0, 112.0, 112.0, 112.0, 112.0, 112.0, 112.0])
        assert lin.fp8_amax_history[0, :4].tolist() == [1.0, 4.0, 2.0, 0.0]
        assert lin.fp8_bad_amax[:, 0].tolist() == [1, 5]  # one non-finite in a row now; 5 skipped updates in all
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "non-finite amax" in warnings[0].getMessage()
        # inf (above), NaN, inf: the third consecutive non-finite update stops
        with fp8.autocast(recipe=recipe):
            lin(_probe(math.nan))
        with pytest.raises(RunError, match=r"^FP8 delayed scaling saw a non-finite amax \(inf/NaN\) in 3 consecutive updates of the input of "
                                           r"FP8Linear\(16, 16\) \(scale kept at 112\), expected finite activations"), fp8.autocast(recipe=recipe):
            lin(_probe(math.inf))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    # logged once per process: another run's non-finite amax is silent, until the log is reset
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mmte.fp8.linear"):
        for reset in (False, True):
            if reset:
                reset_bad_amax_log()
            with fp8.autocast(recipe=recipe):
                _identity_linear(recipe)(_probe(math.nan))
    assert ["non-finite amax" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [True]


def test_max_bad_amax_steps_validated_and_zero_never_stops():
    with pytest.raises(ValueError, match=r"max_bad_amax_steps must be an int >= 0 \(0: never stop\); got -1"):
        DelayedScaling(max_bad_amax_steps=-1)
    recipe = DelayedScaling(amax_history_len=4, max_bad_amax_steps=0)
    lin = _identity_linear(recipe)
    for _ in range(20):
        with fp8.autocast(recipe=recipe):
            lin(_probe(math.nan))
    assert lin.fp8_bad_amax[0, 0].item() == 20 and lin.fp8_scale[0].item() == 1.0
