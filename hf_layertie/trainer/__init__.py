"""Training with tying strategies: `TyingTrainingArguments` next to the `TyingTrainer` that reads them, and a run's
life over its sittings (`run_lifecycle`: where a command continues, a finished run, the totals)."""

from ..engine.optimizer_sync import rebuild_data_parallel, sync_optimizer_with_model
from ..engine.tying_history import TYING_HISTORY_NAME
from .checkpoint_format import TYING_STATE_NAME
from .guards import check_resumes_saved_settings
from .run_lifecycle import (
    TrainingStart,
    checkpoint_to_resume,
    finished_training_step,
    save_training_outputs,
    training_start,
)
from .training_args import DISTILLATION_DEFAULTS, TyingTrainingArguments, setting_readers, strategy_help
from .tying_plot import TYING_PLOT_NAME, plot_tying_history
from .tying_trainer import TyingTrainer

__all__ = [
    "DISTILLATION_DEFAULTS",
    "TYING_HISTORY_NAME",
    "TYING_PLOT_NAME",
    "TYING_STATE_NAME",
    "TrainingStart",
    "TyingTrainer",
    "TyingTrainingArguments",
    "check_resumes_saved_settings",
    "checkpoint_to_resume",
    "finished_training_step",
    "plot_tying_history",
    "rebuild_data_parallel",
    "save_training_outputs",
    "setting_readers",
    "strategy_help",
    "sync_optimizer_with_model",
    "training_start",
]
