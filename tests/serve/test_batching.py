"""The server's batched path equals each request run alone, in process (no HTTP): fp32 within 1e-5, variable-length
WAVs padded by the collate included; bf16 answers against ``mmte predict``'s within the documented tolerance."""

from __future__ import annotations

import io

import pytest
import torch

from .conftest import FP32, predict

pytest.importorskip("litserve")

#: fp32: a batch's answer equals the request alone
FP32_TOL = 1e-5
#: bf16 (bf16-mixed autocast): a probability against mmte predict's (other batch sizes, other bf16 roundings); docs/serving.md
BF16_TOL = 2e-3


class _Upload:
    """What LitServe hands the API for a multipart file field (a starlette UploadFile's reading side)."""

    def __init__(self, data: bytes, filename: str):
        self.file, self.filename = io.BytesIO(data), filename

    def read(self) -> bytes:
        return self.file.read()


def _api(argv: list[str]):
    from mmte.cli.serve import served_model
    from mmte.serve import ServeAPI

    served = served_model([*argv, "--ckpt_path", "best"])
    api = ServeAPI(lambda: served, max_batch_size=32)
    api.setup("cpu")
    return api


def _probs(answer) -> dict[str, float]:
    assert answer.status == 200, answer.body
    return {c["class"]: c["prob"] for c in answer.body["top_k"]}


def _assert_batch_equals_alone(api, payloads, tol: float) -> None:
    reqs = [api.decode_request(p()) for p in payloads]
    batched = api.predict(reqs)
    alone = [api.predict([api.decode_request(p())])[0] for p in payloads]
    for b, a in zip(batched, alone, strict=True):
        assert b.body["pred"] == a.body["pred"], (b.body, a.body)
        pb, pa = _probs(b), _probs(a)
        assert pb.keys() == pa.keys() and max(abs(pb[c] - pa[c]) for c in pb) <= tol, (pb, pa)


def test_variable_length_wavs_batched_equal_each_alone_fp32(fsdd_run):
    _, base, wavs = fsdd_run
    api = _api(base)
    assert api.served.dtype == "fp32"
    payloads = [lambda w=w: {"audio": _Upload(w.read_bytes(), w.name), "top_k": 10} for w in wavs]
    frames = {api.served.spec.decode(p())[0][0].shape[0] for p in payloads}
    assert len(frames) > 1, frames  # the batch is padded
    _assert_batch_equals_alone(api, payloads, FP32_TOL)
    # the raw probabilities too (the answers are rounded to 6 digits)
    samples = [api.served.spec.decode(p())[0][0] for p in payloads]
    m = api.served.module
    with torch.inference_mode():
        whole = m.predict_step(api.served.spec.collate(samples), 0)["digit"]["prob"]
        each = torch.cat([m.predict_step(api.served.spec.collate([s]), 0)["digit"]["prob"] for s in samples])
    torch.testing.assert_close(whole, each, rtol=0, atol=FP32_TOL)


def test_arrays_batched_equal_each_alone_fp32(quick_run):
    from mmte.data.datasets import sklearn_arrays

    _, base = quick_run
    api = _api([*base, *FP32])
    assert api.served.dtype == "fp32"
    x, _, _ = sklearn_arrays("digits")
    payloads = [lambda i=i: {"image": x[i].tolist(), "top_k": 10, "id": str(i)} for i in range(24)]
    _assert_batch_equals_alone(api, payloads, FP32_TOL)


def test_the_bf16_inference_copy_answers_one_item_and_batches(quick_run):
    """A bf16 inference copy (``predict_dtype bf16``) under the recipe's precision: one item alone (its few-row path) and
    a batch both answer, within BF16_TOL of each other."""
    from mmte.data.datasets import sklearn_arrays

    _, base = quick_run
    api = _api([*base, "--model.predict_dtype", "bf16"])
    assert api.served.dtype == "bf16"
    x, _, _ = sklearn_arrays("digits")
    payloads = [lambda i=i: {"image": x[i].tolist(), "top_k": 10, "id": str(i)} for i in range(24)]
    _assert_batch_equals_alone(api, payloads, BF16_TOL)


def test_bf16_answers_equal_mmte_predict_within_tolerance(quick_run):
    """The recipe's own precision (auto: bf16-mixed on a CPU with native bf16): predict's rows, and a batch's
    answers against each request alone, within BF16_TOL."""
    import re

    from mmte.data.datasets import sklearn_arrays

    root, base = quick_run
    rows = predict(base, root / "predictions-auto.csv")
    api = _api(base)
    x, _, _ = sklearn_arrays("digits")
    reqs = [api.decode_request({"image": x[int(re.match(r"digits\[(\d+)\]", r["id"]).group(1))].tolist(), "id": r["id"]}) for r in rows[:32]]
    for ans, row in zip(api.predict(reqs), rows, strict=False):
        assert ans.status == 200 and ans.body["id"] == row["id"], ans.body
        assert ans.body["pred"] == row["pred"] and abs(ans.body["prob"] - float(row["prob"])) <= BF16_TOL, (ans.body, row)
    payloads = [lambda i=i: {"image": x[i].tolist(), "top_k": 10, "id": str(i)} for i in range(24)]
    _assert_batch_equals_alone(api, payloads, BF16_TOL)
