"""The reward the tying agent receives for a decision.

After each decision the model trains for `k` more steps, then its held-out loss is measured and

    reward = quality
             - block_cost * num_distinct
             - budget_penalty * max(0, num_distinct - distinct_budget)   # only if distinct_budget is set

    quality = loss_before - held_out_loss    # measure="improvement" (default)
            = -held_out_loss                 # measure="loss"

`loss_before` is the held-out loss measured when the action was taken, so "improvement" is what
the k steps after the action achieved. Why it is the default: the held-out loss falls through
training whatever the agent does, so with `-loss` every map visited late in training looks better
than every map visited early, and the Q-values (about `-loss / (1 - gamma)`, i.e. -400 nats for
gamma = 0.99) are dominated by that level rather than by the small differences between actions.
The improvement over the k steps is near zero on average, signed by whether the action helped, and
keeps the Q-values on the scale of the remaining progress. `measure="loss"` stays available: it is
the closest to the paper's reward that still carries signal.

Why not the authors' reward: the paper uses -perplexity clipped to [-10, 10]. A language model's
perplexity is above 10 for almost all of training (it starts near the vocabulary size, ~50,000 for
GPT-2), and during all that time the clipped reward is the constant -10: every action looks the same
and the agent learns nothing. `-loss = -log(perplexity)` keeps ordering the maps at every stage of
training (from ~11 nats at initialisation down to ~1), is on the scale of the training loss the user
already reads, and needs no clipping. The size terms let the user say how many nats of held-out loss
one trainable block copy is worth (`block_cost`), or set a hard-ish ceiling on the number of trainable
copies (`distinct_budget`, enforced by `budget_penalty` nats per block over it).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real
from typing import Literal

from ..models.tying_map import TyingMap


@dataclass
class TyingReward:
    """Reward = held-out improvement (or -held-out loss), minus optional costs for the distinct (trainable) blocks.

    Args:
        block_cost: nats of held-out loss charged per distinct block; 0 rewards quality only.
        distinct_budget: number of distinct blocks allowed before `budget_penalty` applies; None for no budget.
        budget_penalty: nats charged per distinct block beyond `distinct_budget`.
        measure: "improvement" (loss when the action was taken minus loss k steps later) or "loss" (-loss).
    """

    block_cost: float = 0.0
    distinct_budget: int | None = None
    budget_penalty: float = 1.0
    measure: Literal["improvement", "loss"] = "improvement"

    def __post_init__(self):
        if self.measure not in ("improvement", "loss"):
            raise ValueError(f"measure must be 'improvement' or 'loss', got {self.measure!r}")
        for name in ("block_cost", "budget_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0 (nats), got {value!r}")
        budget = self.distinct_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, Integral) or budget < 1):
            raise ValueError(
                f"distinct_budget must be None or an integer >= 1 (block 0 is always distinct), got {budget!r}"
            )

    def __call__(self, held_out_loss: float, tying_map: TyingMap, loss_before: float | None = None) -> float:
        """The reward for reaching `tying_map` with `held_out_loss` (mean nats per token).

        `loss_before`, the held-out loss when the action was taken, is required by `measure="improvement"`.
        A non-finite loss gives a non-finite reward, which `TyingAgent.learn` skips.
        """
        if self.measure == "improvement":
            if loss_before is None:
                raise ValueError("measure='improvement' needs loss_before, the held-out loss when the action was taken")
            quality = float(loss_before) - float(held_out_loss)
        else:
            quality = -float(held_out_loss)
        num_distinct = tying_map.num_distinct
        reward = quality - self.block_cost * num_distinct
        if self.distinct_budget is not None:
            reward -= self.budget_penalty * max(0, num_distinct - self.distinct_budget)
        return reward
