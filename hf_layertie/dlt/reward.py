"""The reward of a tying decision, from the loss of the `k` training steps that follow it.

    default variant:  reward = -loss - reward_block_cost * distinct_blocks
    paper variant:    reward = clip(-exp(loss), -10, 10) - reward_block_cost * distinct_blocks

`loss` is the mean training loss over the `k` optimizer steps after the decision (`reward_source="train"`,
free: the Trainer computes it anyway, and each batch is scored before the model trains on it) or the loss of a
fixed held-out batch after those steps (`reward_source="held_out"`). Under knowledge distillation (`distill_from`)
the training loss is the run's objective, the cross-entropy and the KL to the teacher mixed; a held-out batch is
scored by its cross-entropy alone.

Why `-loss`: it orders maps at every stage of training, from ~8 nats at initialisation down to ~1. The
authors' `-perplexity` clipped to [-10, 10] is the constant -10 whenever perplexity > 10, which is nearly all
of training for a language model: then every action earns the same reward and nothing is learned. The paper
variant keeps it, to be faithful.

The loss falls through training whatever the agent does, so the reward has a trend; the default agent
estimates that trend jointly with the value of each map (`AfterstateValue`) and learns only from what the
trend does not explain; its per-decision `advantage` is logged. `reward_block_cost` says how many nats of loss one
more block that owns weights is worth (0: quality only; `max_distinct_blocks` is the hard limit on memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..checks import check_real, perplexity
from ..models.tying_map import TyingMap

REWARD_KINDS = ("negative_loss", "clipped_negative_perplexity")
REWARD_OF_VARIANT = {"default": "negative_loss", "paper": "clipped_negative_perplexity"}


@dataclass
class TyingReward:
    """Reward of reaching `tying_map` with `loss` (mean nats per token) over the window after a decision.

    Args:
        reward_kind: `"negative_loss"` (the default variant's) or `"clipped_negative_perplexity"` (the paper
            variant's, constant -10 whenever the loss is above ln 10 = 2.30 nats). Either variant may learn from
            either: the paper's agent with `-loss` is the control that separates its algorithm from its reward.
        reward_block_cost: nats charged per block that owns weights; 0 rewards quality only.
    """

    reward_kind: str = "negative_loss"
    reward_block_cost: float = 0.0

    def __post_init__(self):
        if self.reward_kind not in REWARD_KINDS:
            raise ValueError(f"reward_kind must be one of {', '.join(map(repr, REWARD_KINDS))}, got {self.reward_kind!r}")
        check_real("reward_block_cost", self.reward_block_cost, 0.0, math.inf, high_open=True)

    @classmethod
    def for_variant(cls, variant: str, reward_block_cost: float = 0.0, reward_kind: str | None = None) -> TyingReward:
        """The reward an agent variant learns from: `reward_kind`, or the variant's own when None."""
        return cls(reward_kind=reward_kind or REWARD_OF_VARIANT[variant], reward_block_cost=reward_block_cost)

    def __call__(self, loss: float, tying_map: TyingMap) -> float:
        """A non-finite loss gives a NaN reward, which the agents skip."""
        loss = float(loss)
        if not math.isfinite(loss):
            return math.nan
        if self.reward_kind == "negative_loss":
            quality = -loss
        else:  # -perplexity is never above 0, so only the lower clip bound can apply
            quality = max(-10.0, -perplexity(loss))
        return quality - self.reward_block_cost * tying_map.num_distinct
