"""`TyingController`: an agent's decisions and their rewards, without a model or a training loop.

It holds the agent, the reward and the proposal waiting for its reward, and it checkpoints them as one state
dict. `hf_layertie.decisions.AgentDecisions` runs it inside training (it adds the schedule and measures the loss
of each window; the trainer keeps the log); `hf_layertie.dlt.synthetic` drives it without a model.

    outcome, proposal = controller.decide(index, tying_map, planned_decisions, window_loss)
    model.retie(proposal.new_map)
    ...
    outcome = controller.finish(window_loss)            # at the end of training: the last proposal's outcome

A proposal's outcome (its window's loss and reward) is known at the next decision, so `decide` returns the
outcome of the previous proposal with the new one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..models.tying_map import TyingMap
from .agent import AfterstateAgent, Proposal, TyingAgent
from .reward import TyingReward


@dataclass(frozen=True)
class Outcome:
    """What followed a proposal: `loss` of the window after it and its `reward` (None when not finite: strict JSON
    has no NaN), `advantage` (default agent: reward minus the trend fitted with it) and `q_error` (the squared prediction
    error before the update; None when nothing was learned)."""

    loss: float | None
    reward: float | None
    advantage: float | None
    q_error: float | None


class TyingController:
    """Runs `agent` on the rewards `reward` computes.

    Args:
        agent: any `TyingAgent` (`make_agent`).
        reward: the reward of a decision from the loss that follows it.

    Attributes:
        pending: the proposal waiting for its reward.
    """

    def __init__(self, agent: TyingAgent, reward: TyingReward):
        self.agent = agent
        self.reward = reward
        self.pending: Proposal | None = None

    def decide(
        self, index: int, tying_map: TyingMap, planned_decisions: int, window_loss: float | None
    ) -> tuple[Outcome | None, Proposal]:
        """Reward the pending proposal with `window_loss`, then propose decision number `index`; returns the
        pending proposal's outcome (None when nothing was pending) and the new proposal.

        `window_loss` is the loss of the steps since the pending proposal (None when nothing is pending or no
        loss was measured: the pending proposal then gets no reward).
        """
        outcome = self.finish(window_loss)
        self.pending = self.agent.propose(tying_map, index, planned_decisions)
        return outcome, self.pending

    def finish(self, window_loss: float | None) -> Outcome | None:
        """Reward the pending proposal with the loss of the steps after it; returns its outcome."""
        if self.pending is None:
            return None
        proposal, self.pending = self.pending, None
        reward = math.nan if window_loss is None else self.reward(window_loss, proposal.new_map)
        q_error = self.agent.learn(proposal, reward)
        advantage = None
        if isinstance(self.agent, AfterstateAgent) and math.isfinite(reward):
            advantage = self.agent.advantage(proposal, reward)
        return Outcome(loss=_finite_or_none(window_loss), reward=_finite_or_none(reward), advantage=advantage, q_error=q_error)

    def state_dict(self) -> dict:
        """Agent, reward and pending proposal; plain types and tensors (`weights_only=True` loads it)."""
        pending = None
        if self.pending is not None:
            pending = {
                "index": self.pending.index,
                "block": self.pending.block,
                "source": self.pending.source,
                "explored": self.pending.explored,
                "epsilon": self.pending.epsilon,
                "old_map": self.pending.old_map.to_list(),
                "new_map": self.pending.new_map.to_list(),
            }
        return {
            "agent": self.agent.state_dict(),
            "reward": {"reward_kind": self.reward.reward_kind, "reward_block_cost": self.reward.reward_block_cost},
            "pending": pending,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned: the run then continues exactly as the saved one would."""
        missing = {"agent", "reward", "pending"} - set(state)
        if missing:
            raise ValueError(f"tying state is missing {sorted(missing)}; expected the keys of TyingController.state_dict()")
        saved_reward = dict(state["reward"])
        if saved_reward != {"reward_kind": self.reward.reward_kind, "reward_block_cost": self.reward.reward_block_cost}:
            raise ValueError(f"the saved reward {saved_reward} differs from this run's {self.reward}")
        self.agent.load_state_dict(state["agent"])
        pending = state["pending"]
        self.pending = None
        if pending is not None:
            self.pending = Proposal(
                index=pending["index"],
                block=pending["block"],
                source=pending["source"],
                explored=pending["explored"],
                epsilon=pending["epsilon"],
                old_map=TyingMap(pending["old_map"]),
                new_map=TyingMap(pending["new_map"]),
            )


def _finite_or_none(value: float | None) -> float | None:
    """Strict JSON has no NaN or infinity: a value that is not finite is written as null."""
    return value if value is not None and math.isfinite(value) else None
