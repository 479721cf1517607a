"""What every experiment tracker of a run receives besides the metrics: the merged recipe and the best checkpoint.

Lightning's loggers get the model's and the data's own hyper-parameters by themselves. The run's merged
recipe (every ``--config`` file and flag applied, mmte's defaults filled in: what ``config.yaml`` holds)
and the best checkpoint's path are logged here, through each logger's ``log_hyperparams``, so CSV
(``hparams.yaml``), TensorBoard (the HPARAMS plugin), MLflow (the run's parameters) and W&B (the run's
config) all hold them: ``trainer/max_epochs``, ``model/lr``, ``data/init_args/batch_size``... and
``best_checkpoint``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.cli import SaveConfigCallback

__all__ = ["TrackedConfig"]

#: the hyper-parameter holding the best checkpoint's path, logged when training ends
BEST_CHECKPOINT = "best_checkpoint"


class TrackedConfig(SaveConfigCallback):
    """Lightning's :class:`~lightning.pytorch.cli.SaveConfigCallback` (``config.yaml`` in the log folder)
    that also logs the merged recipe to every logger, and the best checkpoint's path when training ends."""

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not trainer.loggers:
            return
        import yaml

        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False)) or {}
        for logger in trainer.loggers:
            logger.log_hyperparams(config)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        path = getattr(trainer.checkpoint_callback, "best_model_path", "")
        if path and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_hyperparams({BEST_CHECKPOINT: path})
