"""Request decoding and answer rows of ``mmte serve``, without a server: each bad request is one 4xx line."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import torch

from mmte.serve.inputs import InputSpec, RequestError, parse_json
from mmte.serve.outputs import prediction_rows


def _arrays() -> InputSpec:
    return InputSpec("arrays", "image", lambda v: torch.tensor(v), lambda s: {"image": torch.stack(s)}, shape=(8, 8))


class _Upload:
    def __init__(self, data: bytes, filename: str = "x.wav"):
        self.file, self.filename = io.BytesIO(data), filename

    def read(self) -> bytes:
        return self.file.read()


def _wav(n: int = 1600) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes((np.sin(np.arange(n) / 5) * 3000).astype(np.int16).tobytes())
    return buf.getvalue()


def test_an_array_request_decodes_to_one_sample():
    samples, ids, k = _arrays().decode({"image": np.zeros((8, 8)).tolist(), "top_k": 2, "id": "a"})
    assert len(samples) == 1 and samples[0].shape == (8, 8) and ids == ["a"] and k == 2


@pytest.mark.parametrize(("payload", "needle"), [
    ({"image": [[1, 2], [3, 4]]}, "has shape [2, 2]"),
    ({"imag": [[0.0] * 8] * 8}, "unknown field(s) ['imag']"),
    ({}, "has no field 'image'"),
    ([1, 2], "is a JSON list"),
    ({"image": "abc"}, "not a nested list of numbers"),
    ({"image": [[1, "a"]]}, "not a nested list of numbers"),
    ({"image": [[float("nan")] * 8] * 8}, "NaN or infinite"),
    ({"image": [[0.0] * 8] * 8, "top_k": -1}, "top_k is -1"),
])
def test_bad_array_requests_are_one_line_400s(payload, needle):
    with pytest.raises(RequestError) as e:
        _arrays().decode(payload)
    assert e.value.status == 400 and needle in str(e.value) and "\n" not in str(e.value) and "expected" in str(e.value)


def test_files_are_read_by_the_preprocessing_and_bad_files_named():
    from mmte.data.audio import preprocess_audio

    spec = InputSpec("files", "audio", lambda p: preprocess_audio(p, num_mel_bins=32), lambda s: {"audio": s})
    samples, ids, _ = spec.decode({"audio": _Upload(_wav(), "3_theo_1.wav")})
    assert ids == ["3_theo_1.wav"] and samples[0].shape[1] == 32
    with pytest.raises(RequestError, match=r"file 'bad.wav' of field 'audio' cannot be read"):
        spec.decode({"audio": _Upload(b"RIFF not really a wav", "bad.wav")})
    with pytest.raises(RequestError, match="is a text value, not a file"):
        spec.decode({"audio": "3_theo_1.wav"})
    with pytest.raises(RequestError, match="is empty"):
        spec.decode({"audio": _Upload(b"", "e.wav")})


def test_rows_must_have_the_trained_columns():
    spec = InputSpec("rows", "tabular", None, lambda s: s, columns=["a", "b"], extra_columns=("target", "id"),
                     encode_rows=lambda frame: [{"numeric": torch.tensor([float(x), float(y)])} for x, y in zip(frame["a"], frame["b"])])
    samples, ids, _ = spec.decode({"rows": [{"a": 1, "b": 2}, {"a": 3, "b": 4, "id": "r2", "target": 1}]})
    assert len(samples) == 2 and ids == ["0", "r2"]
    with pytest.raises(RequestError, match=r"row 0 lacks \['b'\] and has unknown \['c'\]"):
        spec.decode({"rows": [{"a": 1, "c": 2}]})
    with pytest.raises(RequestError, match="is a list"):
        spec.decode({"rows": [{"a": [1], "b": 2}]})
    with pytest.raises(RequestError, match="field 'rows' is a list .empty."):
        spec.decode({"rows": []})


def test_invalid_json_is_a_400():
    with pytest.raises(RequestError, match="not valid JSON"):
        parse_json(b"{bad")


def test_answer_rows_are_predictions_csv_rows_with_top_k():
    prob = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]])
    res = {"digit": {"pred": prob.argmax(-1), "prob": prob}}
    rows = prediction_rows(res, ["a", "b"], ["x", "y", "z"], [2, 0])
    assert rows[0] == {"id": "a", "pred": "y", "prob": pytest.approx(0.7), "top_k": [{"class": "y", "prob": pytest.approx(0.7)},
                                                                                        {"class": "z", "prob": pytest.approx(0.2)}]}
    assert rows[1] == {"id": "b", "pred": "x", "prob": 0.5}
    value = prediction_rows({"price": {"value": torch.tensor([[1.5], [2.0]])}}, ["0", "1"], None)
    assert value == [{"id": "0", "value": 1.5}, {"id": "1", "value": 2.0}]
