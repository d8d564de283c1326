"""The Q-learning agent that decides, one block at a time, which block each block is tied to.

The loop it is made for (the `TyingTrainer` runs it every `k` optimizer steps):

    decision = agent.propose(model.tying_map)       # block i: tie to j < i, or stay independent
    model.retie(decision.new_map); train k steps; measure the held-out loss
    agent.learn(reward(loss, decision.new_map), decision.new_map)

As in the paper, the blocks take turns (1, 2, ..., L-1, 1, ...), actions are epsilon-greedy and
epsilon decays once per sweep. Learning is one-step online Q-learning on the transition just seen,
without replay buffer or target network: decisions are expensive (each one costs `k` training
steps), so there are few of them, and the environment (the model being trained) drifts anyway.

Everything the agent draws comes from its own `torch.Generator`: two agents with the same seed
decide the same way, and the global torch RNG, which orders the Trainer's data and drives dropout,
is never touched. The agent lives on the CPU; it is a few thousand multiply-adds per decision.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from numbers import Integral, Real

import torch
from torch.nn import functional as F

from ..models.tying_map import TyingMap
from .q_network import TyingQNetwork

logger = logging.getLogger(__name__)

_STATE_KEYS = ("num_blocks", "q_network", "optimizer", "epsilon", "next_block", "pending", "generator", "history")


def _check_integer(name: str, value, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name} must be an integer{bound}, got {value!r}")


def _check_real(name: str, value, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
    """Raise unless `value` is a real number between `low` and `high` (each bound excluded when open)."""
    is_real = isinstance(value, Real) and not isinstance(value, bool)
    above = is_real and (value > low if low_open else value >= low)
    below = is_real and (value < high if high_open else value <= high)
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")


@dataclass
class AgentConfig:
    """Hyperparameters of `TyingAgent`. The defaults are the paper's.

    Args:
        hidden_size: width of the Q-network's two hidden layers.
        learning_rate: Adam learning rate of the Q-network.
        gamma: discount of future rewards.
        epsilon_start: initial probability of a uniformly random action.
        epsilon_decay: factor applied to epsilon after every full sweep over blocks 1..L-1.
        epsilon_min: floor of epsilon. `epsilon_start = epsilon_decay = epsilon_min = 1` is the random baseline.
        seed: seed of the agent's own generator (Q-network initialisation and exploration).
    """

    hidden_size: int = 128
    learning_rate: float = 1e-3
    gamma: float = 0.99
    epsilon_start: float = 1.0
    epsilon_decay: float = 0.95
    epsilon_min: float = 0.1
    seed: int = 0

    def __post_init__(self):
        _check_integer("hidden_size", self.hidden_size, minimum=1)
        _check_integer("seed", self.seed)
        _check_real("learning_rate", self.learning_rate, 0.0, math.inf, low_open=True, high_open=True)
        _check_real("gamma", self.gamma, 0.0, 1.0)
        _check_real("epsilon_start", self.epsilon_start, 0.0, 1.0)
        _check_real("epsilon_min", self.epsilon_min, 0.0, 1.0)
        _check_real("epsilon_decay", self.epsilon_decay, 0.0, 1.0, low_open=True)
        if self.epsilon_min > self.epsilon_start:
            raise ValueError(
                f"epsilon_min ({self.epsilon_min}) must not exceed epsilon_start ({self.epsilon_start}): "
                f"epsilon only decays"
            )


@dataclass(frozen=True)
class Decision:
    """One proposal of the agent.

    `source` is the chosen action: the block whose weights `block` should use (`block` itself for
    independent). It may be a block that is itself tied; `new_map` holds the canonical result.
    `explored` tells whether the action was drawn at random (with probability `epsilon`) rather
    than taken greedily from the Q values.
    """

    block: int
    source: int
    explored: bool
    epsilon: float
    old_map: TyingMap
    new_map: TyingMap


class TyingAgent:
    """Epsilon-greedy Q-learning over tying decisions, one block per decision.

    Args:
        num_blocks: number of transformer blocks `L` (at least 2).
        config: hyperparameters; `AgentConfig()` (the paper's settings) when omitted.

    Attributes:
        history: one JSON-serialisable record per decision (`block`, `source`, `explored`,
            `epsilon`, `q_values`, `map_before`, `map_after`, and `reward` / `q_loss` once learned).
    """

    def __init__(self, num_blocks: int, config: AgentConfig | None = None):
        _check_integer("num_blocks", num_blocks, minimum=2)
        self.num_blocks = int(num_blocks)
        self.config = AgentConfig() if config is None else config
        self._generator = torch.Generator().manual_seed(self.config.seed)
        # nn.Linear initialises from the global RNG: seed a forked copy of it from our generator.
        init_seed = int(torch.randint(2**62, (), generator=self._generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            self.q_network = TyingQNetwork(self.num_blocks, self.config.hidden_size)
        self.optimizer = torch.optim.Adam(self.q_network.parameters(), lr=self.config.learning_rate)
        self._epsilon = float(self.config.epsilon_start)
        self._next_block = 1
        self._pending: dict | None = None
        self.history: list[dict] = []

    @property
    def epsilon(self) -> float:
        """Probability that the next proposal is a uniformly random action."""
        return self._epsilon

    @property
    def next_block(self) -> int:
        """The block the next proposal will be about."""
        return self._next_block

    @property
    def pending(self) -> bool:
        """Whether a proposal is waiting for its reward (`learn`)."""
        return self._pending is not None

    def q_values(self, tying_map: TyingMap, block: int | None = None) -> torch.Tensor:
        """The Q values of `block`'s `block + 1` actions in `tying_map` (default: `next_block`)."""
        tying_map = self._checked_map(tying_map, "tying_map")
        with torch.no_grad():
            q_row = self.q_network(TyingQNetwork.encode(tying_map))
        return self.q_network.block_q_values(q_row, self._next_block if block is None else block)

    def propose(self, tying_map: TyingMap) -> Decision:
        """Choose the action of the next block in the sweep, epsilon-greedily, and remember it for `learn`.

        A pending decision that was never rewarded is dropped: callers without a reward (the random
        baseline run without held-out data) simply keep proposing.
        """
        old_map = self._checked_map(tying_map, "tying_map")
        block, epsilon = self._next_block, self._epsilon
        q_values = self.q_values(old_map, block)
        explored = torch.rand((), generator=self._generator).item() < epsilon
        if explored:
            source = int(torch.randint(block + 1, (), generator=self._generator))
        else:
            source = int(q_values.argmax())
        new_map = old_map.with_decision(block, source)

        self._pending = {"state": TyingQNetwork.encode(old_map), "block": block, "action": source}
        self.history.append(
            {
                "block": block,
                "source": source,
                "explored": explored,
                "epsilon": epsilon,
                "q_values": q_values.tolist(),
                "map_before": old_map.render(),
                "map_after": new_map.render(),
                "reward": None,
                "q_loss": None,
            }
        )
        self._advance_sweep()
        return Decision(block, source, explored, epsilon, old_map, new_map)

    def learn(self, reward: float, next_map: TyingMap) -> float | None:
        """One temporal-difference update of the pending decision; returns the Q loss.

        Target: `reward + gamma * max_a' Q(next_map, a')`, where `a'` ranges over the actions of
        the block the NEXT proposal is about. Those are the only actions available from `next_map`;
        a max over every block's outputs would bootstrap from choices the agent cannot make there.
        Loss: Huber (delta 1) rather than MSE, as in DQN: a loss spike in the trained model gives
        one outsized TD error, and Huber keeps it from dominating Adam's moment estimates.

        Returns None, without touching the Q-network, when nothing is pending or when `reward` is
        NaN or infinite (a diverged evaluation: logged as a warning). The decision is no longer
        pending afterwards in every case.
        """
        if self._pending is None:
            return None
        next_state = TyingQNetwork.encode(self._checked_map(next_map, "next_map"))
        pending, self._pending = self._pending, None
        reward = float(reward)
        if not math.isfinite(reward):
            logger.warning(
                "TyingAgent: reward %s for the decision about block %d is not finite; skipping its Q update",
                reward,
                pending["block"],
            )
            return None

        with torch.no_grad():
            next_q = self.q_network.block_q_values(self.q_network(next_state), self._next_block)
            target = reward + self.config.gamma * next_q.max()
        q_value = self.q_network.block_q_values(self.q_network(pending["state"]), pending["block"])[pending["action"]]
        loss = F.huber_loss(q_value, target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

        q_loss = loss.item()
        self.history[-1].update(reward=reward, q_loss=q_loss)
        return q_loss

    def state_dict(self) -> dict:
        """Everything needed to resume: Q-network, its optimizer, epsilon, sweep position, pending
        decision, generator state and history. Plain tensors, numbers, strings, lists and dicts, so
        `torch.load(..., weights_only=True)` reads it."""
        pending = None if self._pending is None else dict(self._pending)
        return {
            "num_blocks": self.num_blocks,
            "q_network": self.q_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epsilon": self._epsilon,
            "next_block": self._next_block,
            "pending": pending,
            "generator": self._generator.get_state(),
            "history": copy.deepcopy(self.history),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned; the agent then decides exactly as the saved one would."""
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"agent state is missing {missing}; expected the keys of TyingAgent.state_dict()")
        if state["num_blocks"] != self.num_blocks:
            raise ValueError(f"agent state is for {state['num_blocks']} blocks, this agent has {self.num_blocks}")
        self.q_network.load_state_dict(state["q_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._epsilon = float(state["epsilon"])
        self._next_block = int(state["next_block"])
        self._pending = None if state["pending"] is None else dict(state["pending"])
        self._generator.set_state(state["generator"])
        self.history = copy.deepcopy(state["history"])

    def _checked_map(self, tying_map: TyingMap, name: str) -> TyingMap:
        try:
            return TyingMap(tying_map, num_blocks=self.num_blocks)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None

    def _advance_sweep(self) -> None:
        if self._next_block < self.num_blocks - 1:
            self._next_block += 1
            return
        self._next_block = 1
        self._epsilon = max(self.config.epsilon_min, self._epsilon * self.config.epsilon_decay)
