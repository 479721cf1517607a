"""The LitServe API of ``mmte serve``: decode each request, batch the good ones, predict, answer each.

LitServe runs :class:`ServeAPI` in its inference worker processes: ``setup`` builds the served model
there (:func:`~mmte.serve.model.build_served`, from the command line, so nothing large is pickled
across processes), ``decode_request`` turns one request into samples, ``predict`` runs the requests
LitServe collected (up to ``max_batch_size``) as one batch, ``encode_response`` writes each answer.

Decoding (the modality's preprocessing: for audio the WAV read, resampling and log-mel) runs on one
torch thread: its tensors are small, a second thread only adds hand-offs (and waits for a core the
server's other processes hold); the results are the same to the bit. The forward keeps the worker's
threads.

A bad request never fails its batch: decoding catches the :class:`~mmte.serve.inputs.RequestError`
and the request is answered with its status and ``{"error": ...}`` while the others are predicted.
If the batched forward itself fails (items the collate cannot put together), each request is run
alone, so only the one that fails gets an error.

:class:`GreedyBatchLoop` is LitServe's batched loop collecting what is already queued instead of
waiting: with ``batch_timeout`` 0 it blocks for the first request, then takes every request that
arrived meanwhile (up to ``max_batch_size``), so one request alone is answered at once and requests
that arrive while a batch runs form the next batch; ``batch_timeout`` > 0 waits that long for more.
Under load (the previous batch held more than one request and the next one arrived within the gap of
the worker asking for it) it also lingers: after what is queued it takes requests as long as each
arrives within a short gap (:attr:`GreedyBatchLoop.linger` of the previous batch's time, at most
:attr:`~GreedyBatchLoop.max_gap` seconds). The clients a batch answered
send their next requests over the next milliseconds, while the API process parses them; without the gap
the worker starts on the first few and the rest form more small batches, each paying a whole forward's
fixed cost (measured on the fsdd_speakers server at concurrency 32: about a fifth more throughput with
the gap). A lone request (concurrency 1) never waits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from queue import Empty
from typing import Any

import litserve as ls
from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError
from litserve.loops.simple_loops import BatchedLoop
from starlette.responses import Response

from .inputs import RequestError

__all__ = ["GreedyBatchLoop", "ServeAPI"]

logger = logging.getLogger("mmte")


@dataclass
class _Request:
    samples: list[Any]
    ids: list[str]
    top_k: int | None
    many: bool  # answered as {"rows": [...]} (a table request), else one row


@dataclass
class _Answer:
    status: int
    body: Any = field(default=None)


def _error(status: int, message: str) -> _Answer:
    return _Answer(status, {"error": message})


class ServeAPI(ls.LitAPI):
    """``POST /predict`` on a served mmte checkpoint.

    Args:
        build: called once in each worker: returns the :class:`~mmte.serve.model.ServedModel` (picklable: a
            module-level function or a ``functools.partial`` of one).
        max_batch_size: most requests run as one batch.
        batch_timeout: seconds to wait for more requests once one is there (0: take what is queued).
        top_k: classes with probabilities in every classification answer unless a request says (0: none).
    """

    def __init__(self, build: Callable[[], Any], max_batch_size: int = 32, batch_timeout: float = 0.0, top_k: int = 0):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path="/predict",
                         loop=GreedyBatchLoop() if max_batch_size > 1 else "auto")
        self._build, self.top_k = build, int(top_k)
        self.served: Any = None

    def setup(self, device: str) -> None:
        self.served = self._build()

    # ----------------------------------------------------------------------------------- steps
    def decode_request(self, request):
        try:
            with _one_thread():
                samples, ids, k = self.served.spec.decode(request)
        except RequestError as e:
            return _error(e.status, str(e))
        finally:
            _close_files(request)
        return _Request(samples, ids, self.top_k if k is None else k, self.served.spec.kind == "rows")

    def batch(self, inputs: list[Any]) -> list[Any]:
        return list(inputs)

    def predict(self, x: Any) -> Any:
        if not isinstance(x, list):  # max_batch_size 1: LitServe's single loop hands one request
            return self._run([x])[0]
        return self._run(x)

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def encode_response(self, output):
        return Response(json.dumps(output.body, allow_nan=False, default=str).encode(), status_code=output.status, media_type="application/json")

    # ----------------------------------------------------------------------------------- batch
    def _run(self, items: list[Any]) -> list[_Answer]:
        out: list[Any] = list(items)
        good = [i for i, r in enumerate(items) if isinstance(r, _Request)]
        if not good:
            return out
        try:
            rows = self._rows([items[i] for i in good])
        except Exception:  # noqa: BLE001 - one item the batch cannot take: each alone, so only it fails
            if len(good) == 1:
                rows = None
            else:
                for i in good:
                    out[i] = self._run([items[i]])[0]
                return out
        if rows is None:
            r = items[good[0]]
            logger.exception("the model failed on request %s", r.ids)
            out[good[0]] = _error(422, f"the model cannot take this input ({', '.join(r.ids)}), expected an input like the training data's, "
                                       "check the file or values")
            return out
        for i, answer in zip(good, rows):
            out[i] = answer
        return out

    def _rows(self, reqs: list[_Request]) -> list[_Answer]:
        samples = [s for r in reqs for s in r.samples]
        ids = [i for r in reqs for i in r.ids]
        ks = [r.top_k for r in reqs for _ in r.samples]
        rows = self.served.predict(samples, ids, ks)
        answers, at = [], 0
        for r in reqs:
            mine, at = rows[at: at + len(r.samples)], at + len(r.samples)
            answers.append(_Answer(200, {"rows": mine} if r.many else mine[0]))
        return answers


@contextlib.contextmanager
def _one_thread() -> Any:
    """torch's intra-op threads at 1 inside, restored after."""
    import torch

    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _close_files(request: Any) -> None:
    """Release the uploads of a multipart request (their spooled buffers)."""
    values = request.values() if hasattr(request, "values") and callable(request.values) else []
    for v in values:
        f = getattr(v, "file", None)
        if f is not None and hasattr(f, "close"):
            with contextlib.suppress(Exception):  # already closed
                f.close()


class GreedyBatchLoop(BatchedLoop):
    """LitServe's batched loop taking the requests already queued (see the module docstring).

    No ``START`` message per request: LitServe only uses it to restart a dead worker's requests
    (``restart_workers``, off in ``mmte serve``; its own loops drop the message then too).
    """

    _stopping = False
    linger = 0.05  #: the gap as a fraction of the previous batch's time (from taking it to asking for the next)
    max_gap = 0.01  #: the longest gap, seconds
    _last_size = 0
    _last_taken = 0.0

    def _gap(self, lit_api: ls.LitAPI, busy: float) -> float:
        """Seconds to wait for each further request of this batch (0: take only what is queued), given the seconds
        the previous batch took."""
        if self._last_size <= 1 or lit_api.batch_timeout > 0:
            return 0.0
        return min(self.max_gap, self.linger * busy)

    def _taken(self, payloads: list) -> None:
        self._last_size, self._last_taken = len(payloads), time.monotonic()

    def get_batch_requests(self, lit_api: ls.LitAPI, request_queue: Any, transport: Any) -> tuple[list, list]:
        payloads: list = []
        timed_out: list = []
        if self._stopping:
            raise _StopLoopError()
        asked = time.monotonic()
        try:
            first = request_queue.get(timeout=1.0)  # blocks (no spinning) until a request or the stop sentinel
        except Empty:
            return payloads, timed_out
        # under load: the first request came within a gap of asking (the clients of the last batch are sending again)
        gap = self._gap(lit_api, asked - self._last_taken)
        if time.monotonic() - asked > max(gap, 1e-3):
            gap = 0.0
        deadline = time.monotonic() + lit_api.batch_timeout
        limit = lit_api.request_timeout not in (-1, False)
        item = first
        while True:
            if item == _SENTINEL_VALUE:
                if payloads:  # answer what was collected, stop at the next call
                    self._stopping = True
                    return payloads, timed_out
                raise _StopLoopError()
            response_queue_id, uid, timestamp, x_enc = item
            if limit and time.monotonic() - timestamp > lit_api.request_timeout:
                timed_out.append((response_queue_id, uid))
            else:
                payloads.append((response_queue_id, uid, x_enc))
            if len(payloads) >= lit_api.max_batch_size:
                self._taken(payloads)
                return payloads, timed_out
            try:
                left = max(deadline - time.monotonic(), gap)
                item = request_queue.get(timeout=left) if left > 0 else request_queue.get_nowait()
            except Empty:
                self._taken(payloads)
                return payloads, timed_out
