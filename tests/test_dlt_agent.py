"""Behaviour of the Dynamic Layer Tying agent (hf_layertie.dlt) on its own, without a Trainer."""

import dataclasses
import io
import json
import logging
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import raw_tying_maps

from hf_layertie import TyingMap
from hf_layertie.dlt import AgentConfig, TyingAgent, TyingQNetwork, TyingReward

GREEDY = AgentConfig(epsilon_start=0.0, epsilon_min=0.0)
RANDOM_BASELINE = AgentConfig(epsilon_start=1.0, epsilon_decay=1.0, epsilon_min=1.0)
SMALL = 16  # hidden size that keeps the many-update tests fast


def tying_maps(max_blocks: int = 8):
    return raw_tying_maps(min_blocks=2, max_blocks=max_blocks).map(TyingMap)


def run_decisions(agent: TyingAgent, tying_map: TyingMap, count: int) -> tuple[list, TyingMap]:
    """Propose and learn `count` times with a reward that depends on the map (fewer copies is better)."""
    decisions = []
    for _ in range(count):
        decision = agent.propose(tying_map)
        agent.learn(-0.3 * decision.new_map.num_distinct, decision.new_map)
        decisions.append((decision.block, decision.source, decision.explored))
        tying_map = decision.new_map
    return decisions, tying_map


def q_weights(agent: TyingAgent) -> list[torch.Tensor]:
    return [parameter.detach().clone() for parameter in agent.q_network.parameters()]


# Q-network


@pytest.mark.parametrize("num_blocks", [2, 3, 12])
def test_each_block_has_one_action_per_source_plus_independent(num_blocks):
    network = TyingQNetwork(num_blocks, hidden_size=8)
    q_row = network(TyingQNetwork.encode(TyingMap.independent(num_blocks)))
    assert q_row.shape == (num_blocks * (num_blocks + 1) // 2 - 1,)
    slices = [network.block_q_values(torch.arange(network.num_actions), block) for block in range(1, num_blocks)]
    assert [len(values) for values in slices] == list(range(2, num_blocks + 1))
    # The slices tile the output exactly: no Q value is shared by two blocks or left unused.
    assert torch.cat(slices).tolist() == list(range(network.num_actions))
    with pytest.raises(ValueError, match="block must be in 1.."):
        network.block_q_values(q_row, 0)


@given(tying_maps())
def test_encoding_is_the_one_hot_of_each_blocks_source(tying_map):
    encoded = TyingQNetwork.encode(tying_map).view(len(tying_map), len(tying_map))
    assert encoded.sum(dim=1).tolist() == [1.0] * len(tying_map)
    assert encoded.argmax(dim=1).tolist() == tying_map.to_list()


def test_forward_rejects_a_state_of_the_wrong_size():
    with pytest.raises(ValueError, match="must have 16 features"):
        TyingQNetwork(4)(torch.zeros(2, 9))


# Proposals


@settings(max_examples=40, deadline=None)
@given(tying_maps(), st.integers(0, 10), st.floats(0.0, 1.0))
def test_propose_returns_a_legal_action_and_the_map_it_leads_to(tying_map, skipped, epsilon):
    agent = TyingAgent(len(tying_map), AgentConfig(hidden_size=8, epsilon_start=epsilon, epsilon_min=0.0))
    for _ in range(skipped):  # move the sweep to an arbitrary block
        agent.learn(0.0, agent.propose(tying_map).new_map)
    block = agent.next_block
    decision = agent.propose(tying_map)
    assert decision.block == block and 1 <= block < len(tying_map)
    assert 0 <= decision.source <= block
    assert decision.old_map == tying_map
    assert decision.new_map == tying_map.with_decision(block, decision.source)
    assert agent.pending


def test_greedy_agent_picks_the_argmax_of_the_blocks_q_values():
    agent = TyingAgent(6, GREEDY)
    tying_map = TyingMap([0, 0, 2, 2, 4, 0])
    for _ in range(10):
        expected = int(agent.q_values(tying_map).argmax())
        decision = agent.propose(tying_map)
        assert (decision.source, decision.explored) == (expected, False)
        agent.learn(-1.0, tying_map)


def test_sweep_visits_blocks_in_order_wraps_and_decays_epsilon_once_per_sweep_down_to_the_floor():
    agent = TyingAgent(5, AgentConfig(epsilon_start=1.0, epsilon_decay=0.5, epsilon_min=0.2))
    tying_map = TyingMap.independent(5)
    blocks, epsilons = [], []
    for _ in range(5 * 4):
        decision = agent.propose(tying_map)
        agent.learn(-1.0, decision.new_map)
        blocks.append(decision.block)
        epsilons.append(decision.epsilon)
    assert blocks == [1, 2, 3, 4] * 5
    assert epsilons == [1.0] * 4 + [0.5] * 4 + [0.25] * 4 + [0.2] * 4 + [0.2] * 4
    assert agent.epsilon == 0.2


def test_random_baseline_chooses_uniformly_among_the_blocks_actions():
    agent = TyingAgent(4, dataclasses.replace(RANDOM_BASELINE, hidden_size=SMALL))
    tying_map = TyingMap.independent(4)
    counts = {block: torch.zeros(block + 1) for block in (1, 2, 3)}
    for _ in range(3 * 200):
        decision = agent.propose(tying_map)
        agent.learn(-1.0, tying_map)  # learning must not make the baseline greedy
        assert decision.explored and decision.epsilon == 1.0
        counts[decision.block][decision.source] += 1
    for block, count in counts.items():
        expected = 200 / (block + 1)
        chi_square = ((count - expected) ** 2 / expected).sum().item()
        assert chi_square < 20, (block, count.tolist())  # p < 0.001 for 3 degrees of freedom is 16.3


def test_proposing_again_without_a_reward_drops_the_unrewarded_decision():
    agent = TyingAgent(3, dataclasses.replace(RANDOM_BASELINE, hidden_size=SMALL))
    weights = q_weights(agent)
    first = agent.propose(TyingMap.independent(3))
    second = agent.propose(first.new_map)
    assert (first.block, second.block) == (1, 2)
    agent.learn(-1.0, second.new_map)
    assert [record["reward"] for record in agent.history] == [None, -1.0]
    assert agent.learn(-1.0, second.new_map) is None  # only the latest decision was pending
    assert any(not torch.equal(old, new) for old, new in zip(weights, q_weights(agent)))


def test_a_map_of_the_wrong_size_is_rejected_naming_the_argument():
    agent = TyingAgent(4)
    with pytest.raises(ValueError, match="tying_map: tying_map has 3 entries but the model has 4 blocks"):
        agent.propose(TyingMap.independent(3))
    agent.propose(TyingMap.independent(4))
    with pytest.raises(ValueError, match="next_map: .*expected exactly one entry per block"):
        agent.learn(-1.0, TyingMap.independent(5))
    assert agent.pending  # a rejected call does not lose the transition


# Learning


def test_a_td_update_moves_q_toward_the_target_and_a_constant_reward_is_learned():
    agent = TyingAgent(2, dataclasses.replace(RANDOM_BASELINE, gamma=0.0, learning_rate=1e-2, hidden_size=SMALL))
    tying_map = TyingMap.independent(2)
    decision = agent.propose(tying_map)
    before = agent.q_values(tying_map, 1)[decision.source].item()
    assert agent.learn(-3.0, tying_map) > 0
    after = agent.q_values(tying_map, 1)[decision.source].item()
    assert abs(after - (-3.0)) < abs(before - (-3.0))

    for _ in range(300):
        agent.learn(-3.0, agent.propose(tying_map).new_map)
    assert torch.allclose(agent.q_values(tying_map, 1), torch.tensor([-3.0, -3.0]), atol=0.05)


def test_the_td_target_is_the_reward_plus_the_best_action_of_the_next_block_to_decide():
    agent = TyingAgent(4, AgentConfig(gamma=0.9, seed=5))
    decision = agent.propose(TyingMap.independent(4))  # block 1; block 2 decides next
    q_taken = agent.q_values(decision.old_map, 1)[decision.source]
    next_q_rows = agent.q_network(TyingQNetwork.encode(decision.new_map)).detach()
    next_block_best = agent.q_network.block_q_values(next_q_rows, 2).max()
    # A max over every output, or over the slice of the block just decided, would be caught:
    assert next_block_best not in (next_q_rows.max(), agent.q_network.block_q_values(next_q_rows, 1).max())
    expected = torch.nn.functional.huber_loss(q_taken, -2.0 + 0.9 * next_block_best).item()
    assert agent.learn(-2.0, decision.new_map) == pytest.approx(expected, rel=1e-6)


def test_q_converges_to_the_discounted_sum_of_a_constant_reward():
    """On one state with gamma = 0.5, the fixed point of Q = r + gamma * max Q is r / (1 - gamma)."""
    agent = TyingAgent(2, dataclasses.replace(GREEDY, gamma=0.5, learning_rate=1e-2, hidden_size=SMALL))
    tying_map = TyingMap([0, 0])
    for _ in range(600):
        agent.propose(tying_map)
        agent.learn(-1.0, tying_map)  # same state again, so the fixed point is Q = -1 + 0.5 * Q
    assert agent.q_values(tying_map, 1).max().item() == pytest.approx(-2.0, abs=0.1)


def test_learn_with_nothing_pending_returns_none():
    agent = TyingAgent(3)
    assert agent.learn(-1.0, TyingMap.independent(3)) is None
    agent.learn(-1.0, agent.propose(TyingMap.independent(3)).new_map)
    assert agent.learn(-1.0, TyingMap.independent(3)) is None


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_is_skipped_with_a_warning_and_leaves_the_q_network_unchanged(reward, caplog):
    agent = TyingAgent(3)
    tying_map = TyingMap.independent(3)
    agent.learn(-1.0, agent.propose(tying_map).new_map)  # give Adam some state too
    weights, adam_state = q_weights(agent), agent.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    decision = agent.propose(tying_map)
    with caplog.at_level(logging.WARNING, logger="hf_layertie.dlt.agent"):
        assert agent.learn(reward, decision.new_map) is None
    assert "not finite" in caplog.text and "block 2" in caplog.text
    assert not agent.pending
    assert all(torch.equal(old, new) for old, new in zip(weights, q_weights(agent)))
    assert torch.equal(adam_state, agent.optimizer.state_dict()["state"][0]["exp_avg"])
    assert agent.history[-1]["reward"] is None and agent.history[-1]["q_loss"] is None
    assert agent.learn(-1.0, decision.new_map) is None  # the skipped decision is gone


def test_history_has_one_json_record_per_decision():
    agent = TyingAgent(4)
    _, final_map = run_decisions(agent, TyingMap.independent(4), 5)
    assert len(agent.history) == 5
    record = json.loads(json.dumps(agent.history, allow_nan=False))[-1]
    assert record["map_after"] == final_map.render()
    assert record["block"] == 2 and len(record["q_values"]) == 3
    assert record["reward"] == pytest.approx(-0.3 * final_map.num_distinct)
    assert record["q_loss"] > 0


# Determinism and checkpoints


def test_same_seed_same_decisions_and_the_global_rng_is_untouched():
    global_state = torch.get_rng_state()
    runs = [run_decisions(TyingAgent(6, AgentConfig(seed=seed)), TyingMap.independent(6), 20)[0] for seed in (7, 7, 8)]
    assert torch.equal(torch.get_rng_state(), global_state)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]

    first, second = TyingAgent(6, AgentConfig(seed=7)), TyingAgent(6, AgentConfig(seed=7))
    assert all(torch.equal(a, b) for a, b in zip(q_weights(first), q_weights(second)))


def test_state_dict_round_trip_resumes_exactly_even_mid_sweep_with_a_decision_pending():
    config = AgentConfig(epsilon_decay=0.7, seed=3)
    uninterrupted = TyingAgent(5, config)
    _, tying_map = run_decisions(uninterrupted, TyingMap.independent(5), 6)  # sweep at block 3, epsilon decayed once
    pending = uninterrupted.propose(tying_map)

    buffer = io.BytesIO()
    torch.save(uninterrupted.state_dict(), buffer)
    buffer.seek(0)
    resumed = TyingAgent(5, dataclasses.replace(config, seed=99))  # the saved generator state wins over the seed
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.pending and resumed.epsilon == uninterrupted.epsilon and resumed.next_block == 4
    assert resumed.history == uninterrupted.history

    for agent in (uninterrupted, resumed):
        agent.learn(-0.3 * pending.new_map.num_distinct, pending.new_map)
    continued = [run_decisions(agent, pending.new_map, 15)[0] for agent in (uninterrupted, resumed)]
    assert continued[0] == continued[1]
    assert all(torch.equal(a, b) for a, b in zip(q_weights(uninterrupted), q_weights(resumed)))
    assert resumed.history == uninterrupted.history


def test_load_state_dict_rejects_another_number_of_blocks():
    with pytest.raises(ValueError, match="for 4 blocks, this agent has 5"):
        TyingAgent(5).load_state_dict(TyingAgent(4).state_dict())


# Reward


def test_reward_orders_every_plausible_loss_unlike_the_clipped_negative_perplexity():
    """Losses 0.5..11 nats (perplexity 1.6..60,000) must give distinct rewards; the paper's
    -perplexity clipped to [-10, 10] is -10 for every loss above ln(10) = 2.3 nats."""
    tying_map = TyingMap.independent(12)
    losses = [0.5 + 0.25 * step for step in range(43)]  # 0.5 .. 11.0
    rewards = [TyingReward(measure="loss")(loss, tying_map) for loss in losses]
    assert all(higher > lower for higher, lower in zip(rewards, rewards[1:]))
    # The improvement over k steps orders the outcomes at every level of loss the action started from.
    for loss_before in losses:
        improvements = [TyingReward()(loss, tying_map, loss_before=loss_before) for loss in losses]
        assert all(higher > lower for higher, lower in zip(improvements, improvements[1:]))
    clipped_perplexity = [max(-10.0, min(10.0, -math.exp(loss))) for loss in losses]
    assert len({value for loss, value in zip(losses, clipped_perplexity) if loss > math.log(10)}) == 1


@given(tying_maps(max_blocks=12), st.floats(0.0, 12.0), st.floats(0.0, 1.0), st.integers(1, 12), st.floats(0.0, 5.0))
def test_reward_charges_block_cost_per_distinct_block_and_penalty_per_block_over_budget(
    tying_map, loss, block_cost, budget, penalty
):
    distinct = tying_map.num_distinct
    assert TyingReward(measure="loss")(loss, tying_map) == -loss
    assert TyingReward()(loss, tying_map, loss_before=5.0) == pytest.approx(5.0 - loss)
    charged = TyingReward(block_cost=block_cost, measure="loss")(loss, tying_map)
    assert charged == pytest.approx(-loss - block_cost * distinct)
    budgeted = TyingReward(distinct_budget=budget, budget_penalty=penalty, measure="loss")(loss, tying_map)
    assert budgeted == pytest.approx(-loss - penalty * max(0, distinct - budget))


def test_reward_prefers_fewer_blocks_at_equal_loss_when_blocks_cost():
    reward = TyingReward(block_cost=0.01)
    assert reward(3.0, TyingMap([0, 0, 0, 0]), loss_before=3.1) > reward(3.0, TyingMap([0, 1, 2, 3]), loss_before=3.1)


def test_improvement_reward_needs_the_loss_before_the_action():
    with pytest.raises(ValueError, match="needs loss_before"):
        TyingReward()(3.0, TyingMap([0, 0]))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"block_cost": -0.1}, "block_cost"),
        ({"block_cost": math.nan}, "block_cost"),
        ({"budget_penalty": -1.0}, "budget_penalty"),
        ({"distinct_budget": 0}, "distinct_budget"),
        ({"distinct_budget": 2.5}, "distinct_budget"),
        ({"measure": "perplexity"}, "measure"),
    ],
)
def test_reward_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field} must"):
        TyingReward(**kwargs)


# Configuration


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": 1.5}, "hidden_size"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": math.inf}, "learning_rate"),
        ({"gamma": 1.5}, "gamma"),
        ({"gamma": -0.1}, "gamma"),
        ({"epsilon_start": 1.1}, "epsilon_start"),
        ({"epsilon_min": -0.1}, "epsilon_min"),
        ({"epsilon_decay": 0.0}, "epsilon_decay"),
        ({"epsilon_decay": 1.01}, "epsilon_decay"),
        ({"epsilon_start": 0.05, "epsilon_min": 0.1}, "epsilon_min"),
        ({"seed": "0"}, "seed"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field} "):
        AgentConfig(**kwargs)


@pytest.mark.parametrize("num_blocks", [1, 0, True])
def test_agent_needs_at_least_two_blocks(num_blocks):
    with pytest.raises(ValueError, match="num_blocks must be an integer >= 2"):
        TyingAgent(num_blocks)


def test_defaults_are_the_papers_settings():
    config = AgentConfig()
    assert (config.epsilon_start, config.epsilon_decay, config.epsilon_min) == (1.0, 0.95, 0.1)
    assert (config.gamma, config.learning_rate) == (0.99, 1e-3)
