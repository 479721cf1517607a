"""The pruning callback a ``mmte tune`` trial runs inside its ``mmte fit`` process.

Optuna's Lightning pruning callback, reporting to the study's storage from the trial's own process:
after each validation it reports the monitored metric (step: the validation's index, so validations
inside an epoch count too) and asks the study's pruner whether to stop. A pruned trial stops at that
step boundary like a finished run (checkpoints written, exit status 0) and is marked in the trial's
user attributes; ``mmte tune`` then records it as pruned. Without a storage the callback only checks
that the metric is logged (``mmte tune``'s pre-flight run).
"""

from __future__ import annotations

from typing import Any

from optuna_integration.pytorch_lightning import PyTorchLightningPruningCallback

from ..errors import UsageError
from .storage import PRUNED_ATTR, PRUNER_ATTR, make_pruner, open_storage

__all__ = ["OptunaPruning"]


class OptunaPruning(PyTorchLightningPruningCallback):
    """Report ``monitor`` to trial ``trial`` of study ``study`` in ``storage`` and stop when pruned.

    Args:
        monitor: the validation metric (``val_acc``, ``val_loss``...).
        storage: the study's storage (path or URL, see :func:`mmte.tune.storage.open_storage`); None: check only.
        study: the study's name.
        trial: the trial's number in the study.
    """

    def __init__(self, monitor: str, storage: str | None = None, study: str | None = None, trial: int | None = None):
        self._validations = 0
        if storage is None:
            self._trial, self.monitor, self.is_ddp_backend = None, monitor, False
            return
        import optuna

        store = open_storage(storage)
        loaded = optuna.load_study(study_name=study, storage=store)
        loaded.pruner = make_pruner(loaded.user_attrs.get(PRUNER_ATTR))
        trial_id = store.get_trial_id_from_study_id_trial_number(store.get_study_id_from_name(study), int(trial))
        super().__init__(optuna.trial.Trial(loaded, trial_id), monitor)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self._trial is not None:
            super().on_fit_start(trainer, pl_module)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        score = trainer.callback_metrics.get(self.monitor)
        if score is None:
            known = ", ".join(sorted(k for k in trainer.callback_metrics if k.startswith("val_"))) or "none"
            raise UsageError(f"--tune.metric {self.monitor} is not logged by this recipe", f"expected one of {known}",
                             f"set --tune.metric {'val_loss' if 'val_loss' in known else 'to one of them'}")
        step, self._validations = self._validations, self._validations + 1
        if self._trial is None:
            return
        stop = False
        if trainer.is_global_zero:
            self._trial.report(float(score), step=step)
            stop = self._trial.should_prune()
            if stop:
                self._trial.set_user_attr(PRUNED_ATTR, step)
        if trainer.world_size > 1:
            stop = trainer.strategy.broadcast(stop)
        trainer.should_stop = trainer.should_stop or bool(stop)
