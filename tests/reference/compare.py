"""Compare two modules on the same input: outputs and every gradient (input and parameters)."""

from __future__ import annotations

import torch


def assert_same_forward_backward(ref, other, x, mask, loss, *, fwd_tol: tuple[float, float], bwd_tol: tuple[float, float]):
    """Run ``loss(m(x, mask)).backward()`` for both modules and assert outputs and gradients match.

    Args:
        ref, other: modules with identical parameters (same order).
        loss: maps the output to a scalar.
        fwd_tol, bwd_tol: (rtol, atol) for the outputs and for the gradients.
    """
    outs, grads = [], []
    for m in (ref, other):
        xi = x.clone().requires_grad_(True)
        out = m(xi, mask)
        loss(out).backward()
        outs.append(out.detach())
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    torch.testing.assert_close(outs[1], outs[0], rtol=fwd_tol[0], atol=fwd_tol[1])
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(b, a, rtol=bwd_tol[0], atol=bwd_tol[1])
