"""The tying agents: one block decides per decision, in turn, epsilon-greedily over its options.

    decision = agent.propose(tying_map, index, planned_decisions)   # block i: stay/become independent or tie
    ... train k steps under decision.new_map, measure the loss ...
    agent.learn(decision, reward)

The loop is the paper's: blocks 1, 2, ..., L-1, 1, ... take turns, and with probability epsilon the action is
drawn uniformly from the block's options. What differs between the agents is what chooses the greedy action
and learns from the reward (see `AgentConfig`): `AfterstateAgent` (the default), `PaperAgent` (the authors'
algorithm) and `RandomAgent` (the ablation: every action random, nothing learned).

Options. The default agent offers each distinct choice once (`TyingMap.decision_options`: independent, or
an earlier block that owns weights): tying to a tied block means tying to its root, so offering every block
would make "tie to block 0" several times likelier than "stay" in an all-tied map and drift exploration
towards collapse. The paper agent keeps the paper's `i + 1` actions. With `max_distinct_blocks`, options
that would exceed the cap are removed for every agent.

Everything an agent draws comes from its own `torch.Generator`: two agents with the same seed decide the
same way, and the global RNG (data order, dropout) is never touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..models.tying_map import TyingMap
from .agent_config import AgentConfig
from .value import AfterstateValue, PaperQNetwork


@dataclass(frozen=True)
class Proposal:
    """What an agent proposes: `block` takes `source`'s weights (`source == block`: independent).

    `index` counts decisions from 0; `explored` tells whether the action was drawn at random. Inside training it
    becomes a `hf_layertie.decisions.Decision`, the strategy-level record the trainer applies and logs.
    """

    index: int
    block: int
    source: int
    explored: bool
    epsilon: float
    old_map: TyingMap
    new_map: TyingMap


class TyingAgent:
    """The decision loop shared by every agent; subclasses say how greedy actions are chosen and learned.

    Args:
        num_blocks: blocks of the model (at least 2: block 0 never decides).
        config: settings; `AgentConfig()` when omitted.
    """

    def __init__(self, num_blocks: int, config: AgentConfig | None = None):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"num_blocks must be an integer >= 2 (block 0 never decides), got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.config = AgentConfig() if config is None else config
        self.generator = torch.Generator().manual_seed(self.config.agent_seed)

    def block_of(self, index: int) -> int:
        """The block that decision number `index` is about: blocks 1..L-1 in turn."""
        return 1 + index % (self.num_blocks - 1)

    def epsilon(self, index: int, planned_decisions: int) -> float:
        """Exploration probability of decision `index`: linear over `exploration_fraction` of the run."""
        config = self.config
        progress = index / max(1.0, config.exploration_fraction * planned_decisions)
        return config.epsilon_start + (config.epsilon_min - config.epsilon_start) * min(1.0, progress)

    def options(self, tying_map: TyingMap, block: int) -> list[int]:
        """The sources `block` may choose, without those that would exceed `max_distinct_blocks`."""
        cap = self.config.max_distinct_blocks
        candidates = self._candidate_sources(tying_map, block)
        if cap is None:
            return candidates
        return [source for source in candidates if tying_map.with_decision(block, source).num_distinct <= cap]

    def _candidate_sources(self, tying_map: TyingMap, block: int) -> list[int]:
        return tying_map.decision_options(block)

    def propose(self, tying_map: TyingMap, index: int, planned_decisions: int) -> Proposal:
        """Proposal number `index` (of about `planned_decisions` in the run), epsilon-greedy."""
        tying_map = self._checked(tying_map)
        block = self.block_of(index)
        options = self.options(tying_map, block)
        if not options:
            raise ValueError(
                f"block {block} has no option within max_distinct_blocks={self.config.max_distinct_blocks} "
                f"from {tying_map}: the map already exceeds the cap"
            )
        epsilon = self.epsilon(index, planned_decisions)
        explored = float(torch.rand((), generator=self.generator)) < epsilon
        if explored:
            source = options[int(torch.randint(len(options), (), generator=self.generator))]
        else:
            source = options[int(torch.argmax(self.scores(tying_map, block, options)))]
        return Proposal(index, block, source, explored, epsilon, tying_map, tying_map.with_decision(block, source))

    def scores(self, tying_map: TyingMap, block: int, options: list[int]) -> torch.Tensor:
        """How good each option looks to the agent (higher is better)."""
        raise NotImplementedError

    def learn(self, decision: Proposal, reward: float) -> float | None:
        """Learn from the reward of `decision`; returns the squared prediction error, None if nothing was learned.

        A NaN or infinite reward (a diverged loss) is skipped: one bad value must not poison the agent.
        """
        if not math.isfinite(reward):
            return None
        return self._learn(decision, float(reward))

    def _learn(self, decision: Proposal, reward: float) -> float | None:
        raise NotImplementedError

    def _next_options(self, decision: Proposal) -> tuple[int, list[int]]:
        """The block deciding after `decision`, and its options from the map `decision` reached."""
        block = self.block_of(decision.index + 1)
        return block, self.options(decision.new_map, block)

    def state_dict(self) -> dict:
        """Everything needed to decide exactly as this agent would; `torch.load(weights_only=True)` reads it."""
        return {"num_blocks": self.num_blocks, "config": self.config.to_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_blocks") != self.num_blocks or state.get("config") != self.config.to_dict():
            raise ValueError(
                f"the saved agent ({state.get('num_blocks')} blocks, {state.get('config')}) is not this agent "
                f"({self.num_blocks} blocks, {self.config.to_dict()})"
            )
        self.generator.set_state(state["generator"])

    def _checked(self, tying_map) -> TyingMap:
        return TyingMap(tying_map, num_blocks=self.num_blocks)


class AfterstateAgent(TyingAgent):
    """The default agent: scores an option by the learned value of the map it leads to (`AfterstateValue`).

    Learning is least squares on every decision so far rather than one stochastic gradient step per
    decision: each decision costs `k` training steps, so a run has hundreds of them, and an exact fit uses
    all of them at once. The target is `reward + gamma * max value of the next block's options` (gamma 0 by
    default).
    """

    def __init__(self, num_blocks: int, config: AgentConfig | None = None):
        super().__init__(num_blocks, config)
        self.value = AfterstateValue(num_blocks, self.config.q_forgetting, self.config.q_ridge)

    def scores(self, tying_map: TyingMap, block: int, options: list[int]) -> torch.Tensor:
        return self.value.values([tying_map.with_decision(block, source) for source in options])

    def _learn(self, decision: Proposal, reward: float) -> float:
        target = reward
        if self.config.q_gamma > 0:
            block, options = self._next_options(decision)
            target += self.config.q_gamma * float(self.scores(decision.new_map, block, options).max())
        return self.value.update(decision.new_map, decision.index, target) ** 2

    def advantage(self, decision: Proposal, reward: float) -> float:
        """How much better `reward` was than the fitted trend at that time (what an average map would get), the
        trend as fitted once this reward is folded in (`TyingController.finish` learns first)."""
        return reward - self.value.trend(decision.index)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "value": self.value.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.value.load_state_dict(state["value"])


class PaperAgent(TyingAgent):
    """Hay & Wolf's agent, following the authors' code (`global_attn/dqn_trainer.py`, `q_learn_loop`).

    - Q-network `PaperQNetwork`: one hidden layer over the raw map, one output slice per block, `i + 1`
      actions for block `i` (tying to a tied block is offered, and means tying to its root).
    - One online update per decision, no replay buffer, no target network: target
      `reward + gamma * max Q(next map)[the same block's slice]` (the authors' code bootstraps from the
      deciding block's own slice), predicted `Q(map before)[block][action]`, MSE loss, AdamW. The max runs over
      every action of the slice, as in that code, which has no cap: under `max_distinct_blocks` it includes
      actions the cap forbids (an over-estimate, small where the reward is -10 nearly everywhere), and the last
      decision of a run bootstraps too, as if training went on.
    - Epsilon multiplies by `epsilon_decay` after every sweep over blocks 1..L-1, down to `epsilon_min`.
    The reward (`clip(-perplexity, -10, 10)`) and the all-tied start are set by `TyingReward` and the trainer.
    """

    def __init__(self, num_blocks: int, config: AgentConfig | None = None):
        super().__init__(num_blocks, config)
        with torch.random.fork_rng(devices=[]):  # nn.Linear draws its initialisation from the global CPU RNG
            torch.default_generator.manual_seed(int(torch.randint(2**62, (), generator=self.generator)))
            self.q_network = PaperQNetwork(num_blocks, self.config.q_hidden_size)
        self.optimizer = torch.optim.AdamW(
            self.q_network.parameters(), lr=self.config.q_learning_rate, weight_decay=self.config.q_weight_decay
        )

    def epsilon(self, index: int, planned_decisions: int) -> float:
        sweeps = index // (self.num_blocks - 1)
        return max(self.config.epsilon_min, self.config.epsilon_start * self.config.epsilon_decay**sweeps)

    def _candidate_sources(self, tying_map: TyingMap, block: int) -> list[int]:
        return list(range(block + 1))

    def scores(self, tying_map: TyingMap, block: int, options: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.q_network.block_q_values(tying_map, block)[options]

    def _learn(self, decision: Proposal, reward: float) -> float:
        with torch.no_grad():
            bootstrap = self.q_network.block_q_values(decision.new_map, decision.block).max()
        target = reward + self.config.q_gamma * bootstrap
        predicted = self.q_network.block_q_values(decision.old_map, decision.block)[decision.source]
        loss = F.mse_loss(predicted, target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def state_dict(self) -> dict:
        return {**super().state_dict(), "q_network": self.q_network.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.q_network.load_state_dict(state["q_network"])
        self.optimizer.load_state_dict(state["optimizer"])


class RandomAgent(TyingAgent):
    """The ablation: the same schedule, options and cap, every action uniformly random, nothing learned."""

    def epsilon(self, index: int, planned_decisions: int) -> float:
        return 1.0

    def _learn(self, decision: Proposal, reward: float) -> None:
        return None


def make_agent(num_blocks: int, config: AgentConfig | None = None, random_actions: bool = False) -> TyingAgent:
    """The agent of `config.dlt_variant`, or the random ablation with the same options and cap."""
    config = AgentConfig() if config is None else config
    if random_actions:
        return RandomAgent(num_blocks, config)
    return {"default": AfterstateAgent, "paper": PaperAgent}[config.dlt_variant](num_blocks, config)
