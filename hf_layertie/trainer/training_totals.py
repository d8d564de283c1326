"""A run's training metrics over all its sittings, carried from checkpoint to checkpoint.

`Trainer.train` reports the loss, runtime and speeds of the steps its own call trained: a run resumed from a
checkpoint reports only the steps after it (a mean loss of the end of training, lower than the run's), and a run
finished from a checkpoint already at `max_steps` reports none. `TyingTrainer` keeps a `TrainingTotals` in every
checkpoint's tying state (`checkpoint_format`), so that a resumed run reports the whole run's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingTotals:
    """The summed training loss (as `Trainer.training_step` returns it, averaged over processes) and the wall time
    in `Trainer.train` of a run's optimizer steps after `start_step`, over every sitting up to a checkpoint.

    `start_step` is 0, except for a run resumed from a checkpoint that holds no totals (a plain Trainer's): its
    metrics then count the steps after that checkpoint only, and say so (`train_metrics_from_step`).
    """

    start_step: int = 0
    loss_sum: float = 0.0
    runtime: float = 0.0

    @classmethod
    def saved_in(cls, tying_state: dict | None, step: int) -> TrainingTotals:
        """The totals of a checkpoint saved at `step` with `tying_state` (None: it has no tying state, a plain
        Trainer's checkpoint: counted from its step)."""
        return cls(**tying_state["training"]) if tying_state is not None else cls(start_step=step)

    def plus(self, loss_sum: float, runtime: float) -> TrainingTotals:
        """These totals with one more sitting's."""
        return dataclasses.replace(self, loss_sum=self.loss_sum + loss_sum, runtime=self.runtime + runtime)

    def metrics(self, step: int, samples_per_step: int, total_flos: float) -> dict[str, float]:
        """`Trainer.train`'s training metrics (`train_loss`, `train_runtime`, `train_*_per_second`, `total_flos`)
        of the steps counted up to `step`, the runtime being the sum of the sittings'."""
        steps = step - self.start_step
        metrics = {
            "train_loss": self.loss_sum / steps if steps > 0 else math.nan,
            "train_runtime": round(self.runtime, 4),
            "total_flos": total_flos,
        }
        if self.runtime > 0:
            metrics["train_samples_per_second"] = round(steps * samples_per_step / self.runtime, 3)
            metrics["train_steps_per_second"] = round(steps / self.runtime, 3)
        if self.start_step > 0:
            metrics["train_metrics_from_step"] = self.start_step
        return metrics
