"""`TyingDecisions`: the one interface every tying strategy implements, and `TrainingRun`, what it may ask of
the training loop.

A strategy owns the whole life of its decisions: when one is due, what it is (proposed on the main process and
sent to the others), its application (through `TrainingRun.apply`), its reward, its log row, and the state a
checkpoint keeps of it. `TyingTrainer` only calls these methods; a new strategy is one subclass and one entry
in `hf_layertie.decisions.DECISIONS`.
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

import torch

from ..models.tying_map import TyingMap


class TrainingRun(Protocol):
    """The training loop as a strategy sees it (`TyingTrainer` provides it)."""

    step: int  # the optimizer step about to be taken
    max_steps: int
    tying_map: TyingMap  # the model's map now
    is_main_process: bool
    process_index: int
    num_processes: int

    def timed(self, part: str) -> AbstractContextManager:
        """Charge the wall time of a block to `part` of the tying overhead."""

    def broadcast(self, message: Any) -> Any:
        """The main process's `message` on every process (collective)."""

    def mean_over_processes(self, value: float) -> float:
        """The mean of `value` over processes (collective)."""

    def gather(self, value: float) -> list[float]:
        """`value` of every process, by rank (collective)."""

    def held_out_loss(self) -> float:
        """The loss of the fixed held-out reward batch (main process only)."""

    def block_distances(self) -> list[float]:
        """Each block's angular distance on the current batch (`hf_layertie.block_similarity`; main process only)."""

    def apply(
        self,
        tying_map: TyingMap,
        tie_init: str = "root",
        untied_weights: dict[int, dict[str, torch.Tensor]] | None = None,
        lora_rank: int | None = None,
        lora_init: str | None = None,
    ) -> dict:
        """Re-tie the model (with its optimizer and DDP wrapper) and return the map's fields for a log row.

        `tie_init` as in `TiedBlocksMixin.retie`; `untied_weights[b]`, when given, replaces the weights of every block
        `b` the map unties (with fresh optimizer state); `lora_rank` then relaxes the ties
        (`hf_layertie.relaxed_ties.relax_ties` with `lora_init`), adding the adapters to the optimizer if it exists."""

    def block_weights(self) -> dict[int, dict[str, torch.Tensor]]:
        """A CPU copy of the weights every block computes with now, by block and name (blocks that share weights
        share one copy)."""

    def log(self, completed: dict | None, current: dict | None) -> None:
        """Log a decision whose outcome is known (`completed`) and the decision now in force (`current`)."""


class TyingDecisions:
    """Base of every strategy: no decision ever (conventional training, `tying_strategy="none"`).

    Class attributes:
        mode: the `tying_strategy` word that selects the class ("dlt", "static", ...).
        settings: the `TyingTrainingArguments` fields the strategy reads, each with the value it takes when left
            unset (`None`: stays unset). `TyingTrainingArguments` refuses every other tying setting, fills these
            defaults, and a resumed run must repeat them.
        needs_tied_model: whether the model must be a `TiedBlocksMixin` model.
        changes_map: whether the map changes during training (so DDP cannot assume a static graph).
    """

    mode: ClassVar[str] = "none"
    settings: ClassVar[dict[str, Any]] = {}
    needs_tied_model: ClassVar[bool] = False
    changes_map: ClassVar[bool] = False

    def __init__(self, args, num_blocks: int):
        self.args = args
        self.num_blocks = num_blocks
        self.rows: list[dict] = []

    @classmethod
    def resolve_arguments(cls, args) -> None:
        """Check this strategy's settings (and fill defaults that depend on other settings) once the
        `TyingTrainingArguments` `args` have refused the settings it does not read and filled `settings`' defaults."""

    @property
    def records(self) -> list[dict]:
        """Every decision of the run in order, the one in force included: which map held from which step."""
        return list(self.rows)

    @property
    def completed_rows(self) -> list[dict]:
        """The decisions whose outcome is known (what `tying_history.jsonl` holds)."""
        return list(self.rows)

    def start(self, run: TrainingRun) -> None:
        """Called once the trainer is built: apply the map training starts from, if the strategy has one."""

    def check_run(self, max_steps: int) -> None:
        """Called before the first step, when the run's length is known: refuse a run the strategy cannot serve."""

    def is_due(self, step: int) -> bool:
        """Whether a decision is taken before optimizer step `step`."""
        return False

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Every training micro-batch's loss (as the Trainer returns it)."""

    def decide(self, run: TrainingRun) -> None:
        """Take the decision that is due, on every process at the same step."""
        raise NotImplementedError(f"{type(self).__name__} takes no decisions")

    def finish(self, run: TrainingRun) -> None:
        """Training ended: complete what is still open (the last decision's reward)."""

    def state_dict(self, run: TrainingRun) -> dict:
        """What a checkpoint keeps; may be collective (every process calls it)."""
        return {"rows": copy.deepcopy(self.rows)}

    def load_state_dict(self, state: dict, run: TrainingRun) -> None:
        self.rows = copy.deepcopy(state["rows"])
