"""The contract every registered modality meets (its tokenizer, default head and example inputs, on a tiny
backbone): checks shared by the registry sweep (every built-in) and the extending tests (a user's modality)."""

from __future__ import annotations

import fnmatch

import torch

from mmte.tokenizers.registry import get_modality

from .helpers import call_tokenizer, example_batch, head_spec, pooled, tiny_model

POLICIES = ["backbone", "tokenizers", "none", ["backbone.layers.0.*", "heads.*.proj*"]]


def check_forward_shape_no_nan(modality: str, size: int) -> None:
    """Tokens [B, N, D] (B * C for channel-independent series), a bool mask or none, finite outputs of the
    default head's shape; the larger input gives at least as many tokens."""
    model = tiny_model(modality)
    batch = example_batch(modality, size, n=3)
    seq = call_tokenizer(model.tokenizers[modality], batch)
    assert seq.tokens.dim() == 3 and seq.dim == 64
    # time series are channel-independent: B * C sequences; every other modality keeps B
    c = seq.extras.get("channels", 1)
    assert seq.batch_size == 3 * c
    if seq.mask is not None:
        assert seq.mask.shape == seq.tokens.shape[:2] and seq.mask.dtype == torch.bool
    assert torch.isfinite(seq.tokens).all()
    out = model({modality: batch})["h"]
    head = get_modality(modality).default_head["name"]
    if head == "classification":
        assert out.shape == (3, 5)
    elif head == "forecasting":
        assert out.shape == (3, head_spec(modality)["horizon"], c)
    assert torch.isfinite(out).all()
    if size == 1:  # the larger input gives at least as many tokens
        small = call_tokenizer(model.tokenizers[modality], example_batch(modality, 0, n=3))
        assert seq.num_tokens >= small.num_tokens


def expected_trainable(model, policy) -> set[str]:
    """The parameter names a freeze policy leaves trainable."""
    names = [n for n, _ in model.named_parameters()]
    if policy == "backbone":
        return {n for n in names if not n.startswith("backbone.")}
    if policy == "tokenizers":
        return {n for n in names if not n.startswith("tokenizers.")}
    if policy == "none":
        return set(names)
    return {n for n in names if not any(fnmatch.fnmatch(n, g) for g in policy)}


def check_backward_reaches_exactly_trainable(modality: str, policy) -> None:
    """Under ``policy``, a backward pass gives every trainable parameter a finite non-zero gradient and no
    frozen one a gradient."""
    model = tiny_model(modality, freeze=policy)
    expected = expected_trainable(model, policy)
    assert set(model.trainable_parameter_names()) == expected
    out = model({modality: example_batch(modality, 1, n=2)})["h"]
    (out.float() ** 2).sum().backward()
    for n, p in model.named_parameters():
        if n in expected:
            assert p.grad is not None, f"{n} is trainable but got no gradient"
            assert torch.isfinite(p.grad).all(), n
            assert p.grad.abs().sum() > 0, f"{n} got an all-zero gradient"
        else:
            assert p.grad is None, f"{n} is frozen but got a gradient"


def check_meta_construction_and_reset(modality: str) -> None:
    """Built on the meta device (with LoRA), every module owning parameters has ``reset_parameters()``, which
    alone makes them finite (what Lightning's materialisation does); LoRA starts as a no-op."""
    model = tiny_model(modality, device="meta", lora={"rank": 2})
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    with torch.no_grad():  # poison every tensor: only reset_parameters() may make them valid
        for p in model.parameters():
            p.fill_(float("nan"))
        for b in model.buffers():
            b.fill_(-12345 if not b.is_floating_point() else float("nan"))
    for name, m in model.named_modules():  # what Lightning does: each module owning parameters
        if any(True for _ in m.parameters(recurse=False)):
            assert hasattr(m, "reset_parameters"), f"{name} ({type(m).__name__}) owns parameters but has no reset_parameters"
            m.reset_parameters()
    for n, p in model.named_parameters():
        assert torch.isfinite(p).all(), f"{n} not initialised by reset_parameters"
    batch = example_batch(modality, 0, n=2)
    out = model({modality: batch})["h"]
    assert torch.isfinite(out).all()
    # LoRA's B starts at zero: the adapters do not change the output at init
    for n, p in model.named_parameters():
        if n.endswith(".lora.B"):
            assert p.abs().sum() == 0, n
    ref = tiny_model(modality)
    assert {n: p.shape for n, p in ref.named_parameters()}.items() <= {n: p.shape for n, p in model.named_parameters()}.items()


def check_padding_is_masked(modality: str) -> None:
    """A variable-length sample padded in a batch pools and encodes as it does alone; a fixed-size modality
    has no mask and refuses (or never produces) a mixed-size batch."""
    spec = get_modality(modality)
    small, large = spec.example(0, 0), spec.example(1, 1)
    model = tiny_model(modality).eval()
    if not spec.variable_length:
        # fixed-size modalities: no padding mask, and mixing sizes in a batch is refused
        seq = call_tokenizer(model.tokenizers[modality], spec.collate_fn([small, spec.example(0, 1)]))
        assert seq.mask is None
        try:
            spec.collate_fn([small, large])
        except ValueError:
            pass
        else:
            assert all(
                torch.equal(torch.tensor(a.shape), torch.tensor(b.shape))
                for a, b in zip(
                    (small if isinstance(small, dict) else {"x": small}).values(), (large if isinstance(large, dict) else {"x": large}).values()
                )
            ), "different-sized samples were collated without a mask"
        return
    padded = spec.collate_fn([small, large])
    alone = spec.collate_fn([small])
    seq_p = call_tokenizer(model.tokenizers[modality], padded)
    seq_a = call_tokenizer(model.tokenizers[modality], alone)
    # sample 0 really is padded in the mixed batch
    lens = [v for k, v in padded.items() if k in ("frames", "num_points", "lengths", "num_nodes", "num_bands")] if isinstance(padded, dict) else []
    if "attention_mask" in padded:
        lens = [padded["attention_mask"].sum(1)]
    assert lens and int(lens[0][0]) < int(lens[0][1])
    if seq_p.mask is not None:
        assert not bool(seq_p.mask[0].all())
        assert int(seq_p.mask[0].sum()) == seq_a.num_tokens
    with torch.no_grad():
        a = pooled(model, modality, padded)[0]
        b = pooled(model, modality, alone)[0]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        # the real tokens themselves are unchanged by padding
        hp, sp = model.forward_backbone({modality: seq_p})[modality]
        ha, _ = model.forward_backbone({modality: seq_a})[modality]
        real = sp.full_mask()[0]
        torch.testing.assert_close(hp[0][real], ha[0], rtol=1e-5, atol=1e-5)
