"""The DataModules' samplers (torch and Lightning pieces), and which loader resumes training.

* Training: torch's ``DistributedSampler`` over ``range(n)``, shuffled by ``(seed, epoch)`` (Lightning
  calls ``set_epoch``). Every rank draws the same global permutation and rank ``r`` of ``R`` takes items
  ``r, r + R, ...`` of it (padded by repeating its start to a multiple of ``R``, or cut with
  ``drop_last``), so with a per-rank batch of ``B / R`` the ranks' batch ``k`` together hold exactly one
  process's batch ``k`` of size ``B``: multi-process losses equal one process's.
* Evaluation: Lightning's ``UnrepeatedDistributedSampler`` in order (rank ``r`` takes ``r, r + R, ...``,
  no padding), so every item is scored exactly once over all ranks.
* Training loads through :class:`mmte.training.guards.ResumableDataLoader`, whose ``state_dict`` (epoch,
  batches served) Lightning stores in every checkpoint, so a run stopped mid-epoch continues with exactly
  the batches it had not seen. torchdata's ``StatefulDataLoader`` resumes mid-epoch alike, but a run
  stopped at an epoch's last batch under ``limit_train_batches`` and resumed does not end with the
  uninterrupted run's weights (tests/training/test_signals.py, ``sigint-epoch-end``), so it serves only
  iterable (streamed) datasets, through :class:`ResumableLoader`.

Both samplers are ``DistributedSampler`` instances, which Lightning leaves in place.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

__all__ = ["ResumableLoader", "eval_sampler", "train_sampler"]

_EPOCH = "mmte_epoch"

logger = logging.getLogger(__name__)


def train_sampler(n: int, seed: int = 0, num_replicas: int = 1, rank: int = 0, drop_last: bool = False) -> DistributedSampler:
    """The training sampler over ``n`` items: a permutation of ``(seed, epoch)``, sharded over ``num_replicas`` ranks."""
    return DistributedSampler(range(n), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=drop_last)


def eval_sampler(n: int, num_replicas: int = 1, rank: int = 0) -> DistributedSampler:
    """The evaluation sampler over ``n`` items: in order, sharded without padding (every item once over all ranks).

    Raises:
        ValueError: fewer items than ranks (a rank without a batch would stall the others).
    """
    if n < num_replicas:
        raise ValueError(f"an evaluation split of {n} item(s) cannot be sharded over {num_replicas} data-parallel ranks; expected at least one item per rank")
    return UnrepeatedDistributedSampler(range(n), num_replicas=num_replicas, rank=rank, shuffle=False)


class ResumableLoader(StatefulDataLoader):
    """torchdata's ``StatefulDataLoader`` with two additions Lightning's resume needs.

    * Its state records the sampler's epoch. A state from another epoch than the one being started (a
      checkpoint written at an epoch's end, where ``limit_train_batches`` leaves the iterator unfinished)
      is dropped, so that epoch starts from its beginning instead of skipping batches of it.
    * Without a ``generator`` it uses its own, seeded from the sampler's ``(seed, epoch)`` at every
      iteration: starting an iteration then draws nothing from torch's global generator (where Lightning
      creates the iterator differs between a fresh and a resumed run, and dropout masks must not), and
      worker seeds depend on the epoch only.

    Same arguments as ``StatefulDataLoader``.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self._own_generator = kwargs.get("generator") is None
        if self._own_generator:
            kwargs["generator"] = torch.Generator()
        super().__init__(*args, **kwargs)
        self._state_epoch: int | None = None

    def _epoch(self) -> int:
        return int(getattr(self.sampler, "epoch", 0))

    def __iter__(self):
        epoch = self._epoch()
        if self.next_iter_state is not None and self._state_epoch != epoch:
            self.next_iter_state = None  # a position in another epoch: this one starts at its beginning
        if self._own_generator:
            self.generator.manual_seed((int(getattr(self.sampler, "seed", 0)) * 1_000_003 + epoch + 7_919) % (2**63))
        return super().__iter__()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), _EPOCH: self._epoch()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        self._state_epoch = state.pop(_EPOCH, None)
        if state and self._state_epoch is None:
            logger.warning("the checkpoint's data-loader position is in an older format; the interrupted epoch restarts from its beginning")
            state = {}
        super().load_state_dict(state)
