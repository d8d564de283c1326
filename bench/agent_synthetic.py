"""The tying agents on a synthetic problem with a known best map: does an agent find it, and how often by chance?

    python bench/agent_synthetic.py            # the table of hf_layertie/dlt/README.md, about a minute on one core
    python bench/agent_synthetic.py --seeds 5  # a quicker look

No model is trained: `SyntheticTyingProblem` returns, for any tying map, a window loss made of a falling trend
(training progress), the map's effect (agreement with a hidden best map) and noise. Each row runs the agent and a
random-action baseline on the same problems (paired seeds) and counts how many end exactly on the best map.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from hf_layertie.dlt import AgentConfig, SyntheticTyingProblem, TyingController, TyingReward, make_agent, run_synthetic


@dataclass(frozen=True)
class Scenario:
    name: str
    num_blocks: int
    num_distinct: int
    decisions: int
    cap: int | None = None
    variant: str = "default"
    problem: tuple[tuple[str, float], ...] = ()
    reward_kind: str | None = None  # None: the variant's own reward


SCENARIOS = (
    Scenario("8 blocks, best map has 3 distinct", 8, 3, 200),
    Scenario("same, loss falls 9 -> 3 nats in 60 decisions", 8, 3, 200, problem=(("trend_start", 9.0), ("trend_end", 3.0), ("trend_decisions", 60.0))),
    Scenario("same, noise 0.1 nats (3x the default)", 8, 3, 200, problem=(("noise", 0.1),)),
    Scenario("12 blocks, 4 distinct, no cap", 12, 4, 600),
    Scenario("12 blocks, 4 distinct, cap 4", 12, 4, 600, cap=4),
    Scenario("paper agent, 8 blocks, 3 distinct", 8, 3, 200, variant="paper"),
    Scenario("paper agent, loss below log 10 (reward has signal)", 8, 3, 600, variant="paper", problem=(("trend_start", 2.0), ("trend_end", 1.5))),
    Scenario("paper agent, reward -loss", 8, 3, 200, variant="paper", reward_kind="negative_loss"),
)


def found_and_agreement(scenario: Scenario, seed: int, random_actions: bool) -> tuple[bool, float]:
    problem = SyntheticTyingProblem.random(scenario.num_blocks, scenario.num_distinct, seed=1000 + seed, **dict(scenario.problem))
    config = AgentConfig(dlt_variant=scenario.variant, max_distinct_blocks=scenario.cap, agent_seed=seed)
    controller = TyingController(make_agent(scenario.num_blocks, config, random_actions), TyingReward.for_variant(scenario.variant, reward_kind=scenario.reward_kind))
    final = run_synthetic(controller, problem, scenario.decisions)
    return final == problem.best_map, problem.agreement(final)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20, help="Paired problems per scenario (default 20).")
    seeds = parser.parse_args().seeds
    torch.set_num_threads(1)
    print("| scenario | decisions | agent: best map found | random: found | agent / random agreement |\n|---|---|---|---|---|")
    for scenario in tqdm(SCENARIOS, desc="Scenarios", leave=False):
        agent = [found_and_agreement(scenario, seed, False) for seed in range(seeds)]
        random = [found_and_agreement(scenario, seed, True) for seed in range(seeds)]
        agreement = [sum(a for _, a in runs) / seeds for runs in (agent, random)]
        tqdm.write(
            f"| {scenario.name} | {scenario.decisions} | {sum(f for f, _ in agent)} / {seeds} | {sum(f for f, _ in random)} / {seeds} "
            f"| {agreement[0]:.2f} / {agreement[1]:.2f} |"
        )


if __name__ == "__main__":
    main()
