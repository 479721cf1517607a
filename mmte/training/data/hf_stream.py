"""A streamed training split: a Hugging Face ``IterableDataset`` read shard by shard, shuffled by shards and a
buffer (seeded per epoch), sharded over the data-parallel ranks, and resumable mid-epoch.

* :class:`StreamedSplit` turns raw rows into model items block by block and counts the items it has
  handed out this epoch; that count (with the epoch) is its ``state_dict``, which torchdata's
  ``StatefulDataLoader`` stores per worker in every checkpoint. A resumed run starts the same epoch's
  stream again (same shard order and shuffle buffer: same seed and epoch) and skips that many raw rows
  before any decoding, so it yields exactly the items the interrupted run had not seen yet. (The
  ``datasets`` stream's own ``state_dict`` resumes at a shard offset but loses the shuffle buffer's
  content, so the order after a resume would differ.)
* :class:`StreamLoader` is torchdata's ``StatefulDataLoader`` whose sampler takes Lightning's ``set_epoch``
  to the stream (``IterableDataset.set_epoch``: the shard order and the buffer draw ``seed + epoch``), so a
  saved position is used only in its own epoch, and whose generator is seeded from ``(seed, epoch)`` at
  every iteration, so starting one draws nothing from torch's global generator (a resumed run's dropout
  masks stay the uninterrupted run's).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torch.utils.data.dataloader import _InfiniteConstantSampler
from torchdata.stateful_dataloader import StatefulDataLoader

__all__ = ["StreamLoader", "StreamedSplit"]


class StreamedSplit(IterableDataset):
    """Model items from a ``datasets.IterableDataset`` of raw rows.

    Args:
        stream: the rows (already shuffled and split by node as wanted).
        prepare: ``fn(batch of columns) -> batch of model-format columns`` (the same function the map-style
            path maps over its Arrow table).
        rows: the items this rank yields an epoch, when known (``len`` then works: epochs of a known length).
        block: rows prepared at a time.
    """

    def __init__(self, stream: Any, prepare: Callable[[dict[str, list[Any]]], dict[str, list[Any]]], rows: int | None = None, block: int = 64):
        self.stream, self.prepare, self.rows, self.block = stream, prepare, rows, block
        self._yielded = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return int(self.stream.epoch)

    def __len__(self) -> int:
        if self.rows is None:
            raise TypeError("a stream of unknown length")  # Lightning then counts batches as they come
        return self.rows

    def __iter__(self) -> Iterator[dict[str, Any]]:
        skip, self._skip = self._skip, 0
        self._yielded = skip
        rows = itertools.islice(iter(self.stream), skip, None)
        while True:
            chunk = list(itertools.islice(rows, self.block))
            if not chunk:
                return
            batch = self.prepare({k: [r[k] for r in chunk] for k in chunk[0]})
            for i in range(len(chunk)):
                item = {k: v[i] for k, v in batch.items()}
                item.setdefault("index", self._yielded)
                self._yielded += 1
                yield item

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "rows": self._yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._skip = int(state.get("rows", 0)) if int(state.get("epoch", -1)) == self.epoch else 0


class _EpochSampler(_InfiniteConstantSampler):
    """The iterable loader's placeholder sampler, carrying Lightning's ``set_epoch`` to the stream."""

    def __init__(self, stream: StreamedSplit, seed: int):
        super().__init__()
        self.stream, self.seed, self.epoch = stream, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.stream.set_epoch(epoch)


class StreamLoader(StatefulDataLoader):
    """torchdata's ``StatefulDataLoader`` over a :class:`StreamedSplit`; ``seed`` seeds the worker RNGs per epoch."""

    def __init__(self, dataset: StreamedSplit, seed: int = 0, **kwargs: Any):
        super().__init__(dataset, generator=torch.Generator(), **kwargs)
        self.seed = seed
        sampler = _EpochSampler(dataset, seed)
        object.__setattr__(self, "sampler", sampler)  # DataLoader forbids setting it after __init__; Lightning reads it
        if self.batch_sampler is not None:
            self.batch_sampler.sampler = sampler

    def __iter__(self):
        self.generator.manual_seed((self.seed * 1_000_003 + self.sampler.epoch + 7_919) % (2**63))
        return super().__iter__()
