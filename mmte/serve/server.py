"""The HTTP side of ``mmte serve``: LitServe's server with mmte's request guard, error shape and shutdown.

* :class:`RequestGuard` (an ASGI middleware in the API processes) answers what must never reach a
  worker: a body over ``max_body`` bytes (413), a content type other than JSON or multipart (415), a
  body that is not valid JSON or a multipart form that does not parse (400). So LitServe's own
  request reading cannot fail (it would answer 500).
* ``POST /predict`` is answered by the guard itself (:meth:`MMTEServer.answer`): the request it parsed
  (JSON, or a form whose files are read into :class:`~mmte.serve.inputs.Upload`) goes to the workers'
  queue as it is, with no second parse and none of FastAPI's routing and dependency thread (unless
  LitServe's ``LIT_SERVER_API_KEY`` is set: then its route, which checks the key, answers). The queues
  between the API process and the workers are pipes (:mod:`mmte.serve.transport`), not LitServe's
  manager-process queues.
* Every error answer is ``{"error": "<one line>"}`` with a 4xx status (HTTPExceptions from LitServe or
  FastAPI included: an unknown path is a 404 with that body).
* ``GET /health``: LitServe's (200 ``ok`` once every worker has built the model, 503 before);
  ``GET /info``: the served model's description (:meth:`~mmte.serve.model.ServedModel.info`).
* Shutdown (:class:`MMTEServer`): SIGTERM or SIGINT to the ``mmte serve`` process stops the API
  processes first (uvicorn stops accepting and finishes the requests in flight, for at most
  ``drain_s`` seconds), then stops the inference workers; ``mmte serve`` exits 143 (SIGTERM) or 130
  (SIGINT). A worker that dies stops the server (exit 1).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import signal
import threading
from collections.abc import Callable
from typing import Any

import litserve as ls
from fastapi import Request
from litserve.callbacks.base import EventTypes
from litserve.server import RegularRequestHandler
from litserve.utils import LitAPIStatus, ResponseBufferItem
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from .inputs import RequestError, Upload, parse_json
from .transport import PipeTransport, RequestQueue

__all__ = ["MMTEServer", "RequestGuard", "run_server"]

logger = logging.getLogger("mmte")


class RequestGuard:
    """ASGI middleware guarding ``POST /predict`` (see the module docstring).

    Args:
        app: the ASGI application.
        max_body: largest request body in bytes.
        path: the guarded path.
    """

    def __init__(self, app: Any, max_body: int = 16 << 20, path: str = "/predict", answer: Callable | None = None):
        self.app, self.max_body, self.path, self.answer = app, int(max_body), path, answer

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        limit = f"expected a body of at most {self.max_body} bytes ({self.max_body / 2**20:.1f} MiB)"
        try:
            declared = int(headers.get("content-length", "0") or 0)
        except ValueError:
            declared = 0
        too_big = f"{limit}, send a smaller file (or start mmte serve with a larger --max_body_mb)"
        if declared > self.max_body:
            await _discard(receive, declared)
            await _send_error(send, 413, f"the request body is {declared} bytes, {too_big}")
            return
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", "multipart/form-data"):
            await _send_error(send, 415, f"the request's content type is {ctype or 'missing'!r}, expected application/json or multipart/form-data, "
                                         "send JSON (curl -H 'Content-Type: application/json' -d ...) or a form upload (curl -F field=@file)")
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body:
                if message.get("more_body", False):
                    await _discard(receive, 0)
                await _send_error(send, 413, f"the request body is over {self.max_body} bytes, {too_big}")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        data = b"".join(chunks)
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        try:
            payload = parse_json(data) if ctype == "application/json" else await _parse_form(scope, data)
        except RequestError as e:
            await _send_error(send, e.status, str(e))
            return
        if self.answer is not None:
            await self.answer(payload, scope, receive, send)
            return
        sent = False
        await self.app(scope, replay, send)


async def _discard(receive: Callable, declared: int, most: int = 256 << 20) -> None:
    """Read and drop the rest of a refused body (at most ``most`` bytes), so the client, still sending, reads the answer."""
    if declared > most:
        return
    seen = 0
    while seen <= most:
        message = await receive()
        seen += len(message.get("body", b""))
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


async def _parse_form(scope: dict[str, Any], data: bytes) -> dict[str, Any]:
    """The multipart body as ``{field: str or Upload}`` (a field sent twice: its last value), or a :class:`RequestError`."""
    from starlette.datastructures import UploadFile
    from starlette.requests import Request as StarletteRequest

    async def once() -> dict[str, Any]:
        return {"type": "http.request", "body": data, "more_body": False}

    try:
        form = await StarletteRequest(scope, once).form()
    except Exception as e:  # noqa: BLE001 - any parser error is the client's malformed form
        raise RequestError(f"the multipart form cannot be parsed ({type(e).__name__}: {str(e)[:160]})", "expected a multipart/form-data upload",
                           "send the file with curl -F <field>=@<file>") from None
    try:
        out: dict[str, Any] = {}
        for k, v in form.multi_items():
            out[k] = Upload(await v.read(), v.filename) if isinstance(v, UploadFile) else v
        return out
    finally:
        await form.close()


async def _send_error(send: Callable, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 404:
        detail = f"there is no {request.url.path}, expected POST /predict, GET /health or GET /info, check the URL"
    elif exc.status_code == 405:
        detail = f"{request.method} {request.url.path} is not allowed, expected POST /predict, GET /health or GET /info, use that method"
    return JSONResponse({"error": detail}, status_code=exc.status_code)


class MMTEServer(ls.LitServer):
    """LitServer whose shutdown drains the API processes before it stops the inference workers.

    :meth:`drain` (run in a thread by the SIGTERM / SIGINT handler of ``mmte serve``) stops the API
    processes (uvicorn stops accepting and finishes the requests in flight, for at most :attr:`drain_s`
    seconds), closes the listening socket, then sets LitServer's shutdown event, upon which its ``run``
    stops the inference workers and returns.
    """

    drain_s = 5.0

    def _init_manager(self, num_api_servers: int) -> Any:
        manager = super()._init_manager(num_api_servers)
        if num_api_servers != 1:
            raise ValueError(f"mmte serve runs one API process (its request queue has one writer); got {num_api_servers}")
        for path in list(self.litapi_request_queues):
            self.litapi_request_queues[path] = RequestQueue()
        self._transport = PipeTransport(num_api_servers)
        return manager

    async def answer(self, payload: Any, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        """Queue one request :class:`RequestGuard` parsed for the inference workers and send its answer.

        What LitServe's ``POST /predict`` route does (its request handler queues the payload, the answer comes
        back through the response buffer), without the second parse of the body, FastAPI's routing and the
        thread its dependency (the auth check, none here) runs in. A worker's error is answered as
        ``{"error": ...}`` with its status (LitServe's: a request timed out in the queue 504, anything else 500).
        """
        handler = self.__dict__.get("_mmte_handler")
        if handler is None:
            handler = self._mmte_handler = RegularRequestHandler(self.lit_api, self)
        try:
            uid, _ = await handler._submit_request(payload)
            event = asyncio.Event()
            self.response_buffer[uid] = ResponseBufferItem(event)
            try:
                await event.wait()
                response, status = self.response_buffer.pop(uid).response
            finally:
                self.response_buffer.pop(uid, None)
        except Exception as e:  # a fault of the server itself: still a JSON answer, logged
            logger.exception("answering a request failed")
            response, status = e, LitAPIStatus.ERROR
        if status == LitAPIStatus.ERROR:
            response = _worker_error(response)
        self._callback_runner.trigger_event(EventTypes.ON_RESPONSE.value, litserver=self)
        await response(scope, receive, send)

    def _start_server(self, port: Any, num_uvicorn_servers: Any, log_level: Any, sockets: Any, uvicorn_worker_type: Any, **kwargs: Any) -> Any:
        self._mmte_sockets = sockets
        self._mmte_api_procs = super()._start_server(port, num_uvicorn_servers, log_level, sockets, uvicorn_worker_type, **kwargs)
        return self._mmte_api_procs

    def drain(self) -> None:
        """Stop accepting, finish the requests in flight, then let ``run`` stop the workers (see the class docstring)."""
        procs = list((getattr(self, "_mmte_api_procs", None) or {}).values())
        for uw in procs:
            if uw.is_alive() and hasattr(uw, "terminate"):
                uw.terminate()  # uvicorn's own graceful shutdown
        for uw in procs:
            uw.join(timeout=self.drain_s)
        for sock in getattr(self, "_mmte_sockets", None) or []:
            sock.close()
        if self._shutdown_event is not None:
            self._shutdown_event.set()

    def _perform_graceful_shutdown(self, manager: Any, uvicorn_workers: dict[Any, Any], shutdown_reason: str = "normal") -> None:
        if any(w.is_alive() for w in uvicorn_workers.values()):
            self.drain()
        super()._perform_graceful_shutdown(manager, {k: w for k, w in uvicorn_workers.items() if w.is_alive()}, "normal")


def _worker_error(error: Any) -> JSONResponse:
    """An inference worker's error (an HTTPException, pickled or not, or another exception) as ``{"error": ...}``."""
    if isinstance(error, bytes):
        try:
            error = pickle.loads(error)
        except Exception:  # noqa: BLE001 - an exception that does not unpickle is still a server error
            error = None
    if isinstance(error, StarletteHTTPException):
        return JSONResponse({"error": error.detail if isinstance(error.detail, str) else json.dumps(error.detail)}, status_code=error.status_code)
    logger.error("an inference worker failed: %r", error)
    return JSONResponse({"error": "Internal server error"}, status_code=500)


class _Stop(KeyboardInterrupt):
    """Raised in the main process by SIGTERM / SIGINT: LitServer.run's own way out into its shutdown."""


def run_server(api: ls.LitAPI, info: dict[str, Any], host: str = "127.0.0.1", port: int = 8000, workers: int = 1, max_body: int = 16 << 20,
               timeout: float = 30.0, log_level: str = "warning") -> int:
    """Serve ``api`` until SIGTERM / SIGINT; returns the exit status (143 / 130; 1 when a worker died).

    Args:
        api: the :class:`~mmte.serve.api.ServeAPI`.
        info: what ``GET /info`` answers (besides the server's settings, added here).
        host: the address to listen on (``127.0.0.1``: this machine only; ``0.0.0.0``: every interface).
        port: the TCP port.
        workers: inference worker processes (each builds the model).
        max_body: largest request body in bytes.
        timeout: seconds a request may wait in the queue before it is answered 504.
        log_level: uvicorn's and LitServe's log level.
    """
    server = MMTEServer(api, accelerator="cpu", devices=1, workers_per_device=workers, timeout=timeout, info_path="/litserve/info",
                        middlewares=[(RequestGuard, {"max_body": max_body})])
    from litserve.server import no_auth

    if server.setup_auth(api) is no_auth:  # LIT_SERVER_API_KEY set: LitServe's route, whose dependency checks the key, answers
        for m in server.app.user_middleware:
            if m.cls is RequestGuard:
                m.kwargs["answer"] = server.answer
    server.uvicorn_graceful_timeout = MMTEServer.drain_s - 1.0  # uvicorn's own limit for the requests in flight
    server.app.add_exception_handler(StarletteHTTPException, _http_error)
    full = {**info, "server": {"host": host, "port": port, "workers": workers, "max_batch_size": api.max_batch_size,
                               "batch_timeout": api.batch_timeout, "max_body_bytes": max_body}}

    async def info_route() -> JSONResponse:
        return JSONResponse(full)

    server.app.add_api_route("/info", info_route, methods=["GET"])
    got: list[int] = []
    me = os.getpid()

    def stop(signum: int, frame: Any) -> None:
        if os.getpid() != me:  # a forked API process re-raising the signal uvicorn caught: it is exiting anyway
            return
        if got:
            return
        got.append(signum)
        if server._shutdown_event is None or not getattr(server, "_mmte_api_procs", None):
            raise _Stop()  # not serving yet: leave LitServer.run now
        threading.Thread(target=server.drain, name="mmte-serve-drain", daemon=True).start()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(host=host, port=port, log_level=log_level, generate_client_file=False, access_log=False, num_api_servers=1)
    except _Stop:  # arrived before LitServer.run was listening: stop the workers it started
        for w in getattr(server, "inference_workers", None) or []:
            w.terminate()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 + got[0] if got else 1
