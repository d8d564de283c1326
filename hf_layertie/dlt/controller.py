"""`TyingController`: an agent's decisions and their rewards, without a model or a training loop.

It holds the agent, the reward, the decision waiting for its reward and the log of decisions, and it
checkpoints all of them as one state dict. `hf_layertie.decisions.AgentDecisions` runs it inside training
(it adds the schedule and measures the loss of each window); `hf_layertie.dlt.synthetic` drives it without a model.

    completed, pending = controller.decide(step, tying_map, planned_decisions, window_loss)
    model.retie(pending["map"])
    ...
    controller.finish(window_loss)                      # at the end of training: the last decision's reward

A decision's row enters `rows` once its reward is known, at the next decision, so every row carries its own
decision's reward.
"""

from __future__ import annotations

import copy
import math

from ..models.tying_map import TyingMap
from .agent import AfterstateAgent, Decision, TyingAgent
from .reward import TyingReward


class TyingController:
    """Runs `agent` on the rewards `reward` computes.

    Args:
        agent: any `TyingAgent` (`make_agent`).
        reward: the reward of a decision from the loss that follows it.

    Attributes:
        rows: completed decisions in order, each a JSON-ready dict: `index`, `step` (the optimizer step the map
            took effect), `block`, `source`, `explored`, `epsilon`, `map`, `map_text`, `distinct_blocks`, then
            `loss` (of the window after the decision), `reward`, `advantage` (default agent: reward minus the
            fitted trend) and `q_error` (the squared prediction error before the update).
        pending: the decision waiting for its reward, and `pending_row` its row so far.
    """

    def __init__(self, agent: TyingAgent, reward: TyingReward):
        self.agent = agent
        self.reward = reward
        self.rows: list[dict] = []
        self.pending: Decision | None = None
        self.pending_row: dict | None = None

    @property
    def records(self) -> list[dict]:
        """Every decision so far, the pending one included (what the map was at each step)."""
        return self.rows + ([self.pending_row] if self.pending_row is not None else [])

    def decide(
        self, step: int, tying_map: TyingMap, planned_decisions: int, window_loss: float | None
    ) -> tuple[dict | None, dict]:
        """Reward the pending decision with `window_loss`, then propose the next one; returns the row it completed
        (None when nothing was pending) and the new pending row.

        `window_loss` is the loss of the steps since the pending decision (None when nothing is pending or no
        loss was measured: the pending decision then gets no reward).
        """
        completed = self._complete_pending(window_loss)
        index = len(self.rows)
        decision = self.agent.propose(tying_map, index, planned_decisions)
        self.pending = decision
        self.pending_row = {
            "index": index,
            "step": int(step),
            "block": decision.block,
            "source": decision.source,
            "explored": decision.explored,
            "epsilon": decision.epsilon,
            "map": decision.new_map.to_list(),
            "map_text": decision.new_map.render(),
            "distinct_blocks": decision.new_map.num_distinct,
        }
        return completed, self.pending_row

    def follow(self, completed: dict | None, pending: dict | None) -> None:
        """Keep the log of a process whose agent does not decide in step with the main process's: `completed` and
        `pending` are what `decide` or `finish` returned there."""
        if completed is not None:
            self.rows.append(completed)
        self.pending_row = pending

    def finish(self, window_loss: float | None) -> dict | None:
        """Reward the last decision with the loss of the steps after it; returns its completed row."""
        return self._complete_pending(window_loss)

    def _complete_pending(self, window_loss: float | None) -> dict | None:
        if self.pending is None:
            return None
        decision, row = self.pending, self.pending_row
        reward = math.nan if window_loss is None else self.reward(window_loss, decision.new_map)
        q_error = self.agent.learn(decision, reward)
        advantage = None
        if isinstance(self.agent, AfterstateAgent) and math.isfinite(reward):
            advantage = self.agent.advantage(decision, reward)
        row.update(loss=_finite_or_none(window_loss), reward=_finite_or_none(reward), advantage=advantage, q_error=q_error)
        self.rows.append(row)
        self.pending, self.pending_row = None, None
        return row

    def state_dict(self) -> dict:
        """Agent, pending decision and log; plain types and tensors (`weights_only=True` loads it)."""
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
            "rows": copy.deepcopy(self.rows),
            "pending": pending,
            "pending_row": copy.deepcopy(self.pending_row),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned: the run then continues exactly as the saved one would."""
        missing = {"agent", "reward", "rows", "pending", "pending_row"} - set(state)
        if missing:
            raise ValueError(f"tying state is missing {sorted(missing)}; expected the keys of TyingController.state_dict()")
        saved_reward = dict(state["reward"])
        if "kind" in saved_reward:  # checkpoints written before the setting was named reward_kind
            saved_reward["reward_kind"] = saved_reward.pop("kind")
        if saved_reward != {"reward_kind": self.reward.reward_kind, "reward_block_cost": self.reward.reward_block_cost}:
            raise ValueError(f"the saved reward {saved_reward} differs from this run's {self.reward}")
        self.agent.load_state_dict(state["agent"])
        self.rows = copy.deepcopy(state["rows"])
        pending = state["pending"]
        self.pending = None
        if pending is not None:
            self.pending = Decision(
                index=pending["index"],
                block=pending["block"],
                source=pending["source"],
                explored=pending["explored"],
                epsilon=pending["epsilon"],
                old_map=TyingMap(pending["old_map"]),
                new_map=TyingMap(pending["new_map"]),
            )
        self.pending_row = copy.deepcopy(state["pending_row"])


def _finite_or_none(value: float | None) -> float | None:
    """Strict JSON has no NaN or infinity: a value that is not finite is written as null."""
    return value if value is not None and math.isfinite(value) else None
