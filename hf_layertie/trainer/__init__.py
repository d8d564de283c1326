"""Training with Dynamic Layer Tying: `TyingTrainingArguments` next to the `TyingTrainer` that reads them."""

from .optimizer_sync import rebuild_data_parallel, sync_optimizer_with_model
from .tying_config import TyingTrainingArguments
from .tying_plot import plot_tying_history
from .tying_trainer import TYING_HISTORY_NAME, TYING_PLOT_NAME, TYING_STATE_NAME, TyingTrainer

__all__ = [
    "TYING_HISTORY_NAME",
    "TYING_PLOT_NAME",
    "TYING_STATE_NAME",
    "TyingTrainer",
    "TyingTrainingArguments",
    "plot_tying_history",
    "rebuild_data_parallel",
    "sync_optimizer_with_model",
]
