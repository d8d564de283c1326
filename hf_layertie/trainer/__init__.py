"""Training with tying strategies: `TyingTrainingArguments` next to the `TyingTrainer` that reads them."""

from .checkpoint_format import TYING_STATE_NAME
from .optimizer_sync import rebuild_data_parallel, sync_optimizer_with_model
from .training_args import TyingTrainingArguments
from .tying_history import TYING_HISTORY_NAME
from .tying_plot import plot_tying_history
from .tying_trainer import TYING_PLOT_NAME, TyingTrainer, check_resumes_saved_settings

__all__ = [
    "TYING_HISTORY_NAME",
    "TYING_PLOT_NAME",
    "TYING_STATE_NAME",
    "TyingTrainer",
    "TyingTrainingArguments",
    "check_resumes_saved_settings",
    "plot_tying_history",
    "rebuild_data_parallel",
    "sync_optimizer_with_model",
]
