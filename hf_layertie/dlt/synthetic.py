"""A synthetic tying problem with a known best map, to tell an agent that learns from one that does not.

Training a model to find out whether an agent learns is slow and noisy, and the best map is unknown. Here the
"loss" of the window after a decision is a known function of the map:

    loss(map, t) = trend(t) + effect * (1 - agreement(map, best_map)) + noise

`agreement` is the share of blocks whose source equals the best map's, `trend` falls from `trend_start` to
`trend_end` like a training loss (exponentially, with time constant `trend_decisions`), and `noise` is
Gaussian. The trend makes every late decision look better than every early one unless the agent separates
them; the noise stands for the batch-to-batch variation of real losses.

    problem = SyntheticTyingProblem.random(num_blocks=8, num_distinct=3, seed=0)
    final_map = run_synthetic(controller, problem, decisions=300)
    final_map == problem.best_map

The problem is separable (each block's choice adds to the loss on its own), which suits the default agent's
linear value; real maps may interact more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..models.tying_map import TyingMap
from .controller import TyingController


@dataclass(frozen=True)
class SyntheticTyingProblem:
    """See the module docstring. `seed` drives the noise; `random` also draws `best_map` from it."""

    best_map: TyingMap
    effect: float = 0.5
    noise: float = 0.03
    trend_start: float = 5.0
    trend_end: float = 3.0
    trend_decisions: float = 150.0
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "_generator", torch.Generator().manual_seed(self.seed))

    @classmethod
    def random(cls, num_blocks: int, num_distinct: int, seed: int, **settings) -> SyntheticTyingProblem:
        """A problem whose best map has `num_distinct` blocks owning weights: each block's source drawn uniformly among
        the blocks up to it, given that the map has that many (not uniform over the canonical maps: roots of larger
        groups come up more often). Maps are redrawn until one has that many; where that is unlikely (block `b` owns
        its weights with probability 1 / (b + 1), so most blocks owning theirs may take billions of draws), the same
        distribution is drawn directly after `_REDRAWS` tries."""
        if not 1 <= num_distinct <= num_blocks:
            raise ValueError(f"num_distinct must be in 1..{num_blocks}, got {num_distinct}")
        generator = torch.Generator().manual_seed(seed)
        for _ in range(_REDRAWS):
            entries = [0] + [int(torch.randint(block + 1, (), generator=generator)) for block in range(1, num_blocks)]
            if TyingMap(entries).num_distinct == num_distinct:
                break
        else:
            entries = _entries_with_distinct(num_blocks, num_distinct, generator)
        return cls(best_map=TyingMap(entries), seed=seed, **settings)

    def agreement(self, tying_map: TyingMap) -> float:
        """Share of blocks whose source is the best map's."""
        return sum(mine == best for mine, best in zip(tying_map, self.best_map)) / len(self.best_map)

    def window_loss(self, tying_map: TyingMap, decision_index: int) -> float:
        """The loss of the window after decision number `decision_index` reached `tying_map`."""
        trend = self.trend_end + (self.trend_start - self.trend_end) * math.exp(-decision_index / self.trend_decisions)
        noise = self.noise * float(torch.randn((), generator=self._generator))
        return trend + self.effect * (1.0 - self.agreement(tying_map)) + noise


# Draws of a whole map before `SyntheticTyingProblem.random` draws one with its number of distinct blocks directly.
_REDRAWS = 1000


def _entries_with_distinct(num_blocks: int, num_distinct: int, generator: torch.Generator) -> list[int]:
    """Entries drawn as `SyntheticTyingProblem.random` draws them, conditioned on `num_distinct` owners: blocks
    1..L-1 own their weights independently with probability 1 / (b + 1); `log_weight[b][k]` is the log-probability
    that blocks b.. hold exactly k owners (in logs: deep maps take probabilities below the smallest float), so each
    block is drawn given how many owners the rest must still hold; a block that does not own its weights takes a
    source uniformly among the blocks before it."""
    owns = torch.tensor([1.0 / (block + 1) for block in range(num_blocks)], dtype=torch.float64)
    log_owns, log_ties = owns.log(), (-owns).log1p()
    log_weight = torch.full((num_blocks + 1, num_distinct), -math.inf, dtype=torch.float64)
    log_weight[num_blocks, 0] = 0.0
    for block in range(num_blocks - 1, 0, -1):
        after = log_weight[block + 1]
        owning = torch.cat([torch.tensor([-math.inf], dtype=torch.float64), log_owns[block] + after[:-1]])
        log_weight[block] = torch.logaddexp(log_ties[block] + after, owning)
    entries, needed = [0], num_distinct - 1
    for block in range(1, num_blocks):
        log_chance = log_owns[block] + log_weight[block + 1, needed - 1] - log_weight[block, needed] if needed else -math.inf
        if float(torch.rand((), generator=generator)) < math.exp(log_chance):
            entries.append(block)
            needed -= 1
        else:
            entries.append(int(torch.randint(block, (), generator=generator)))
    return entries


def run_synthetic(
    controller: TyingController, problem: SyntheticTyingProblem, decisions: int, start: TyingMap | None = None
) -> TyingMap:
    """Let `controller` make `decisions` decisions on `problem` from `start` (all tied); returns the final map."""
    num_blocks = len(problem.best_map)
    tying_map = TyingMap([0] * num_blocks) if start is None else start
    window_loss = None
    for index in range(decisions):
        tying_map = controller.decide(index, tying_map, decisions, window_loss)[1].new_map
        window_loss = problem.window_loss(tying_map, index)
    controller.finish(window_loss)
    return tying_map
