"""A small HTTP client for ``mmte serve``: request bodies, concurrent load, and the server's memory.

Used by the serving tests and ``bench/serve.py`` (loopback only): :func:`multipart` builds a file
upload as ``curl -F`` sends it, :func:`run_load` sends a list of requests over ``concurrency``
keep-alive connections from one asyncio loop (a time limit for the whole run) and records each answer's
status, body and latency, :func:`rss_mb` and :func:`cpu_seconds` read the resident memory and the CPU time of a
server's process tree (:func:`process_tree`) from ``/proc``. Standard library only, so a load run adds no dependency.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "Job", "cpu_seconds", "get", "multipart", "post", "process_tree", "rss_mb", "run_load", "wait_healthy"]


@dataclass
class Job:
    """One request of a load run: a body, its content type and what the caller expects (``tag``: free)."""

    body: bytes
    content_type: str = "application/json"
    tag: Any = None


@dataclass
class Answer:
    """One answer: the HTTP status (or the name of the connection error), the JSON body (None if not JSON), seconds
    taken and when it was sent (``time.perf_counter()``)."""

    status: int | str
    body: Any
    seconds: float
    sent: float = 0.0


def multipart(field: str, filename: str, data: bytes, extra: dict[str, str] | None = None) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body with one file field (and text fields ``extra``); returns ``(body, content type)``."""
    boundary = uuid.uuid4().hex
    parts = []
    for k, v in (extra or {}).items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
                 f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _send(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None, content_type: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": content_type} if content_type else {}
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    return r.status, _decode(r.read())


def post(port: int, body: bytes, content_type: str = "application/json", timeout: float = 30.0, path: str = "/predict") -> tuple[int, Any]:
    """One ``POST`` to ``127.0.0.1:port``; returns ``(status, JSON body)``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        return _send(conn, "POST", path, body, content_type)
    finally:
        conn.close()


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    """One ``GET`` to ``127.0.0.1:port``; returns ``(status, JSON body)``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        return _send(conn, "GET", path, None, None)
    finally:
        conn.close()


def wait_healthy(port: int, proc: Any, timeout: float = 300.0) -> None:
    """Wait until ``GET /health`` answers 200.

    Raises:
        RuntimeError: the server process ``proc`` (a ``subprocess.Popen``) exited, or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mmte serve exited with status {proc.returncode} before it was healthy")
        try:
            if get(port, "/health", timeout=2.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"mmte serve on port {port} was not healthy after {timeout:.0f} s")


def run_load(port: int, jobs: Sequence[Job], concurrency: int, time_limit: float = 600.0, timeout: float = 60.0) -> list[Answer | None]:
    """Send ``jobs`` to ``POST /predict`` over ``concurrency`` keep-alive connections, from one thread.

    Job ``i`` goes to connection ``i % concurrency``, in order, each connection waiting for its answer
    before it sends the next (a closed-loop client, as ``concurrency`` users would be). The requests are
    written as prepared bytes and the answers read by their ``Content-Length`` on one asyncio event
    loop, so the client costs the server's cores little (a thread per connection with ``http.client``
    cost about as much CPU per request as the server's HTTP side). A connection stops when
    ``time_limit`` seconds have passed since the start; the jobs it did not send are None in the
    result. A connection error (the server refused, closed or timed out) is the answer's status, as
    the exception's name, and the connection is opened again for the next job.

    Returns:
        One :class:`Answer` (or None: not sent) per job, in the jobs' order.
    """
    out: list[Answer | None] = [None] * len(jobs)
    stop_at = time.monotonic() + time_limit
    heads = {}
    for job in jobs:
        if job.content_type not in heads:
            heads[job.content_type] = (f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {job.content_type}\r\n"
                                       "Content-Length: ").encode()

    async def connection(start: int) -> None:
        reader = writer = None
        try:
            for j in range(start, len(jobs), concurrency):
                if time.monotonic() > stop_at:
                    return
                job = jobs[j]
                t0 = time.perf_counter()
                try:
                    if writer is None:
                        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
                    writer.write(heads[job.content_type] + str(len(job.body)).encode() + b"\r\n\r\n" + job.body)
                    status, raw, close = await asyncio.wait_for(_read_answer(reader), timeout)
                except (OSError, EOFError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
                    status, raw, close = type(e).__name__, None, True
                out[j] = Answer(status, None if raw is None else _decode(raw), time.perf_counter() - t0, t0)
                if close and writer is not None:
                    writer.close()
                    reader = writer = None
        finally:
            if writer is not None:
                writer.close()

    async def main() -> None:
        await asyncio.gather(*(connection(s) for s in range(min(concurrency, len(jobs)))))

    asyncio.run(main())
    return out


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """One HTTP/1.1 answer: ``(status, body, the server closes the connection)``; the body is read by its ``Content-Length``."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection":
            close = value.strip().lower() == "close"
    body = await reader.readexactly(length) if length else b""
    return int(parts[1]), body, close


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += [int(c) for c in fh.read().split()]
    except OSError:
        pass
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, each once (Linux ``/proc``; a process that ended meanwhile is left out)."""
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen or not os.path.isdir(f"/proc/{p}"):
            continue
        seen.add(p)
        out.append(p)
        todo += _children(p)
    return out


def rss_mb(pid: int) -> float:
    """Resident memory (``VmRSS``) of process ``pid`` and all its descendants, in MiB (Linux ``/proc``)."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
    return total / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and all its descendants (Linux ``/proc``)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total
