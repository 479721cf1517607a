"""The queues between ``mmte serve``'s API process and its inference workers, without LitServe's manager process.

LitServe 0.2 passes every request and every answer through ``multiprocessing.Manager()`` queues: each
``put`` and ``get`` is a round trip to the manager process (pickled call, socket, reply), and the API
process reads the answers with a thread per ``get``. :class:`MMTEServer <mmte.serve.server.MMTEServer>`
replaces both:

* requests: :class:`RequestQueue`, a pipe the API process's event loop writes without ever blocking (what
  the pipe cannot take at once waits in a buffer flushed when it is writable; no feeder thread, whose
  every step would wait for the busy event loop to release the GIL) and the workers read directly
  (``get_nowait`` is a poll of the pipe, not a round trip);
* answers: :class:`PipeTransport`, one pipe per API process written by the workers (under a lock, one
  whole message at a time) and read by the API process's event loop as soon as the pipe is readable
  (``loop.add_reader``: no thread, no polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import pickle
import select
import struct
from queue import Empty
from typing import Any

from litserve.transport.base import MessageTransport

__all__ = ["PipeTransport", "RequestQueue"]


class RequestQueue:
    """The requests from the API process (one: its writes are not locked) to the inference workers.

    ``put`` (API process, in its event loop): the pickled item, framed as ``multiprocessing.Connection``
    frames it, written to the pipe without blocking; what does not fit waits in a buffer, flushed in order
    by the event loop when the pipe is writable again. ``get`` / ``get_nowait`` (workers): one whole item,
    under a lock shared by the workers.
    """

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._reader, self._writer = ctx.Pipe(duplex=False)
        self._rlock = ctx.Lock()
        self._pending = bytearray()

    # ------------------------------------------------------------------ API side
    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        msg = struct.pack("!i", len(data)) + data
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        fd = self._writer.fileno()
        if loop is None:  # not in the event loop (tests): a plain blocking write, after what is pending
            self._pending += msg
            while self._pending:
                select.select([], [fd], [])
                self._write(fd)
            return
        if self._pending:  # earlier items wait: keep the order
            self._pending += msg
            return
        os.set_blocking(fd, False)
        self._pending += msg
        self._write(fd)
        if self._pending:
            loop.add_writer(fd, self._flush, loop, fd)

    def _write(self, fd: int) -> None:
        try:
            n = os.write(fd, self._pending)
        except BlockingIOError:
            return
        del self._pending[:n]

    def _flush(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self._write(fd)
        if not self._pending:
            loop.remove_writer(fd)

    # ------------------------------------------------------------------ worker side
    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not self._rlock.acquire(block, timeout if block else None):
            raise Empty
        try:
            if not self._reader.poll(timeout if block else 0):
                raise Empty
            return pickle.loads(self._reader.recv_bytes())
        finally:
            self._rlock.release()

    def get_nowait(self) -> Any:
        return self.get(False)

    def __getstate__(self) -> dict[str, Any]:
        return {"_reader": self._reader, "_writer": self._writer, "_rlock": self._rlock}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending = bytearray()


class PipeTransport(MessageTransport):
    """Answers from the inference workers to the API processes: one pipe per API process (consumer).

    Args:
        consumers: the number of API processes.
    """

    def __init__(self, consumers: int = 1):
        ctx = mp.get_context("spawn")
        pipes = [ctx.Pipe(duplex=False) for _ in range(consumers)]
        self._readers = [r for r, _ in pipes]
        self._writers = [w for _, w in pipes]
        self._locks = [ctx.Lock() for _ in range(consumers)]
        self._inbox: asyncio.Queue | None = None
        self._closed = False

    # ------------------------------------------------------------------ worker side
    def send(self, item: Any, consumer_id: int) -> None:
        with self._locks[consumer_id]:  # several workers: one whole message at a time
            self._writers[consumer_id].send(item)

    # ------------------------------------------------------------------ API side
    def _start(self, consumer_id: int) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        reader = self._readers[consumer_id]

        def readable() -> None:
            try:
                while reader.poll(0):
                    inbox.put_nowait(reader.recv())
            except (EOFError, OSError):  # every writer gone: the server is stopping
                loop.remove_reader(reader.fileno())

        loop.add_reader(reader.fileno(), readable)
        self._inbox = inbox
        return inbox

    async def areceive(self, consumer_id: int = 0, timeout: float | None = None, block: bool = True) -> Any:
        if self._closed:
            raise asyncio.CancelledError("transport closed")
        inbox = self._inbox or self._start(consumer_id)
        try:
            return await asyncio.wait_for(inbox.get(), timeout) if timeout is not None else await inbox.get()
        except asyncio.TimeoutError:
            return None

    def close(self, **kwargs: Any) -> None:
        self._closed = True
        for c in (*self._readers, *self._writers):
            with contextlib.suppress(OSError):
                c.close()

    def __reduce__(self):
        return _rebuild, (self._readers, self._writers, self._locks)


def _rebuild(readers: list, writers: list, locks: list) -> PipeTransport:
    t = PipeTransport.__new__(PipeTransport)
    t._readers, t._writers, t._locks, t._inbox, t._closed = readers, writers, locks, None, False
    return t
