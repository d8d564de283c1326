"""The tying engine: a strategy's decisions taken on a model in training, with no Trainer around it.

`TyingEngine` applies each decision (re-tie, optimizer and wrapper in step, history, log); `Processes` and its
subclasses are the collectives it needs across processes; `optimizer_sync` keeps an optimizer (and a DDP wrapper)
on the model's Parameters after a re-tie, with the per-block learning rates of `block_learning_rates`; and
`tying_history` writes the run's decisions. `TyingTrainer` (`hf_layertie.trainer`) is the engine's glue to
transformers' Trainer; a plain training loop can drive the engine itself.
"""

from .processes import AcceleratorProcesses, DistributedProcesses, Processes
from .tying_engine import OVERHEAD_PARTS, TyingEngine
from .tying_history import TYING_HISTORY_NAME, TyingHistory

__all__ = [
    "OVERHEAD_PARTS",
    "TYING_HISTORY_NAME",
    "AcceleratorProcesses",
    "DistributedProcesses",
    "Processes",
    "TyingEngine",
    "TyingHistory",
]
