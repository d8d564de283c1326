"""`AgentDecisions`: `dlt` (a learning agent) and `random` (the same schedule and options, random actions)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..checks import check_choice, check_integer
from ..dlt import AgentConfig, Outcome, TyingController, TyingReward, make_agent
from ..models.configuration_tying import TIE_INITS
from ..models.tying_map import TyingMap
from ..models.tying_strategies import check_static_spec, resolve_tying_map
from .base import Decision, Observation, StrategySettings, TyingDecisions

logger = logging.getLogger(__name__)

REWARD_SOURCES = ("train", "held_out")
UNTIE_INITS = ("source", "own")


@dataclass(frozen=True)
class RandomSettings(StrategySettings):
    """What `random` reads: `dlt`'s schedule, options, cap and reward, none of its learning (see
    `TyingTrainingArguments` for each setting)."""

    # The paper's k. The embedded default run uses 4 (hf_layertie/language_modeling/defaults/clm_default.json)
    # and the study 2 (bench/settings.py): their runs are short, and k sets how many decisions a run has.
    tying_interval: int = 15
    tying_initial_map: str | None = None
    max_distinct_blocks: int | None = None
    dlt_variant: str = "default"
    reward_source: str = "train"
    reward_kind: str | None = None  # the variant's
    reward_block_cost: float = 0.0
    reward_batch_size: int | None = None  # 16 with reward_source="held_out"
    agent_seed: int | None = None  # the run's --seed
    tie_init: str = "root"
    untie_init: str = "source"

    @property
    def commits(self) -> bool:
        """Whether deciding stops once exploration ends (`commit_after_exploration`: a learning agent's only)."""
        return False


@dataclass(frozen=True)
class DltSettings(RandomSettings):
    """What `dlt` reads: `random`'s settings and the learning agent's (`AgentConfig`'s values for each variant, unset
    taking the variant's), which `random` refuses."""

    q_gamma: float | None = None
    epsilon_start: float | None = None
    epsilon_min: float | None = None
    epsilon_decay: float | None = None
    exploration_fraction: float | None = None
    q_forgetting: float | None = None
    q_ridge: float | None = None
    q_hidden_size: int | None = None
    q_learning_rate: float | None = None
    q_weight_decay: float | None = None
    commit_after_exploration: bool = False

    @property
    def commits(self) -> bool:
        return self.commit_after_exploration


class AgentDecisions(TyingDecisions):
    """Every `tying_interval` optimizer steps, on the first micro-batch of that step, the decision pending since the
    last one gets its reward (the loss of the steps in between) and the agent proposes the next one (main process),
    which the trainer applies on every process. The run's decisions are the trainer's (`Observation.current` is the
    one pending); the strategy keeps the agent and the loss of the open window.

    The loss of a window is the mean training loss over processes (`reward_source="train"`) or the loss of a fixed
    held-out batch (`"held_out"`). A checkpoint keeps each process's part of the open window, so that a resumed
    run rewards its pending decision exactly as an uninterrupted one.
    """

    mode = "dlt"
    state_keys = ("window_loss_sums", "planned_decisions")
    needs_tied_model = True
    changes_map = True
    Settings = DltSettings

    @classmethod
    def resolved_settings(cls, args) -> dict[str, Any]:
        values = super().resolved_settings(args)
        check_integer("tying_interval", values["tying_interval"], minimum=1)
        check_choice("tie_init", values["tie_init"], TIE_INITS)
        check_choice("untie_init", values["untie_init"], UNTIE_INITS)
        initial_map = values["tying_initial_map"]
        if initial_map is not None and not isinstance(initial_map, str):
            raise ValueError(f"tying_initial_map must be a string such as 'all' or '0 0 2 2', got {initial_map!r}")
        if initial_map is not None:
            try:  # the spec's syntax now; whether it fits the model, when the trainer knows the model
                check_static_spec(initial_map)
            except ValueError as error:
                raise ValueError(f"tying_initial_map={initial_map!r}: {error}") from None
        if values["reward_source"] not in REWARD_SOURCES:
            raise ValueError(f"reward_source={values['reward_source']!r}: expected 'train' or 'held_out'")
        if values["reward_source"] == "held_out":
            values["reward_batch_size"] = 16 if values["reward_batch_size"] is None else values["reward_batch_size"]
            check_integer("reward_batch_size", values["reward_batch_size"], minimum=1)
        elif values["reward_batch_size"] is not None:
            raise ValueError("reward_batch_size is only read with reward_source='held_out', not 'train'")
        if values["agent_seed"] is None:
            values["agent_seed"] = args.seed
        _agent_config(values)
        _tying_reward(values)
        if values.get("commit_after_exploration") and values["dlt_variant"] != "default":
            raise ValueError(
                f"commit_after_exploration needs dlt_variant='default', whose exploration ends (after exploration_fraction "
                f"of the decisions); the {values['dlt_variant']!r} agent's epsilon only decays towards its floor"
            )
        return values

    def __init__(self, settings: RandomSettings, num_blocks: int):
        super().__init__(settings, num_blocks)
        if num_blocks < 2:
            raise ValueError(
                f"tying_strategy={settings.tying_strategy!r} decides, for each block after the first, which earlier block's "
                f"weights it uses; the model has {num_blocks} block: train it with tying_strategy='none'"
            )
        self.initial_map = self._initial_map(num_blocks)
        values = dataclasses.asdict(settings)
        agent = make_agent(num_blocks, _agent_config(values), random_actions=self.mode == "random")
        self.controller = TyingController(agent, _tying_reward(values))
        self.interval = settings.tying_interval
        self._window_loss_sum: torch.Tensor | float = 0.0
        self._commit_step: int | None = None  # commit_after_exploration: no decision from this step on
        # Decisions the exploration schedule spans: those of the run's max_steps when it started, kept on resume.
        self._planned: int | None = None

    def _initial_map(self, num_blocks: int) -> TyingMap:
        text = self.settings.tying_initial_map or "all"
        try:
            start = resolve_tying_map(text, num_blocks)
        except ValueError as error:
            raise ValueError(f"tying_initial_map={text!r} does not fit the model: {error}") from None
        cap = self.settings.max_distinct_blocks
        if cap is not None and start.num_distinct > cap:
            raise ValueError(
                f"tying_initial_map={self.settings.tying_initial_map!r} has {start.num_distinct} blocks owning weights, "
                f"more than max_distinct_blocks={cap}"
            )
        return start

    def start(self, observation: Observation) -> Decision:
        """The initial map, outside the run's history: no decision chose it."""
        return Decision(
            index=None,
            step=observation.step,
            map_before=observation.tying_map,
            map_after=self.initial_map,
            tie_init=self.settings.tie_init,
        )

    def check_run(self, max_steps: int) -> None:
        """Plan the exploration schedule over the run's decisions (a resumed run keeps its checkpoint's plan: the
        steps a larger `max_steps` adds decide after it, at the schedule's end, rather than exploring again); warn
        when the run is too short for every block to decide once; with `commit_after_exploration`, fix the step
        from which no decision is taken."""
        planned, deciding = self._planned_decisions(max_steps), self.controller.agent.num_blocks - 1
        if self._planned is None:
            self._planned = planned
        elif planned != self._planned:
            logger.warning(
                f"tying_strategy={self.settings.tying_strategy!r}: the checkpoint's exploration schedule spans "
                f"{self._planned} decisions (the max_steps it was started with), where this run's max_steps={max_steps} "
                f"gives {planned}: the schedule is kept, so exploration goes on as it would have, and the decisions "
                f"after it take the schedule's end"
            )
        if planned < deciding:
            logger.warning(
                f"tying_strategy={self.settings.tying_strategy!r}: {planned} decision(s) in {max_steps} steps at "
                f"tying_interval={self.interval}, fewer than the {deciding} blocks that take turns to decide: some "
                "never decide"
            )
        if self.settings.commits:
            exploring = math.ceil(self.controller.agent.config.exploration_fraction * self._planned)
            self._commit_step = exploring * self.interval

    def _planned_decisions(self, max_steps: int) -> int:
        """Decisions a run of `max_steps` steps takes: one before step 0 and every `interval` steps after."""
        return max(1, math.ceil(max_steps / self.interval))

    def is_due(self, step: int, current: Decision | None) -> bool:
        committed = self._commit_step is not None and step >= self._commit_step
        return step % self.interval == 0 and not committed and (current is None or current.step != step)

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Add a training loss to the window without synchronising the device."""
        if self.settings.reward_source == "train":
            self._window_loss_sum = self._window_loss_sum + loss.detach()

    def decide(self, observation: Observation) -> Decision | None:
        """The pending decision's outcome and the agent's next proposal, as one `Decision` (main process)."""
        started = time.perf_counter()
        window_loss = self._window_loss(observation)
        measured = time.perf_counter()
        if not observation.is_main_process:
            return None
        current = observation.current
        index = 0 if current is None else current.index + 1
        outcome, proposal = self.controller.decide(index, observation.tying_map, self._planned, window_loss)
        return Decision(
            index=index,
            step=observation.step,
            map_before=proposal.old_map,
            map_after=proposal.new_map,
            block=proposal.block,
            source=proposal.source,
            explored=proposal.explored,
            epsilon=proposal.epsilon,
            untie_to_start=self.settings.untie_init == "own",
            awaits_outcome=True,
            previous_outcome=outcome,
            seconds={"reward": measured - started, "decision": time.perf_counter() - measured},
        )

    def finish(self, observation: Observation) -> Outcome | None:
        """The last decision's outcome, from the loss of the steps after it."""
        window_loss = self._window_loss(observation)
        return self.controller.finish(window_loss) if observation.is_main_process else None

    def _window_loss(self, observation: Observation) -> float | None:
        """The loss of the steps since the pending decision (None when nothing is pending or no step was taken).

        Every process joins the reduction, so all must call it at the same step: they do, because every process
        has the same decisions (the trainer sends the main process's to the others)."""
        pending = observation.current
        if pending is None or pending.completed:
            return None
        if self.settings.reward_source == "held_out":  # only the main process's agent reads it
            return observation.held_out_loss() if observation.is_main_process else None
        window_sum, self._window_loss_sum = float(self._window_loss_sum), 0.0
        window_sum = observation.mean_over_processes(window_sum)
        steps = observation.step - pending.step
        return window_sum / steps if steps > 0 else None

    def state_dict(self, observation: Observation) -> dict:
        """The controller, the exploration plan, and the open window's loss sum of every process, by rank
        (collective)."""
        window_loss_sums = observation.gather(float(self._window_loss_sum))
        return {**self.controller.state_dict(), "planned_decisions": self._planned, "window_loss_sums": window_loss_sums}

    def load_state_dict(self, state: dict, observation: Observation) -> None:
        """Restore a checkpoint; each process takes back its own part of the open window (the mean of them all when
        the run resumes on another number of processes: the window's mean over processes is then kept)."""
        state = dict(state)
        missing = [key for key in self.state_keys if key not in state]
        if missing:  # before anything is restored
            raise ValueError(f"tying state is missing {missing}; expected the keys of AgentDecisions.state_dict()")
        sums = state.pop("window_loss_sums")
        self._planned = state.pop("planned_decisions")
        self.controller.load_state_dict(state)
        if len(sums) == observation.num_processes:
            self._window_loss_sum = sums[observation.process_index]
        else:
            self._window_loss_sum = sum(sums) / len(sums)


class RandomDecisions(AgentDecisions):
    """`random`: `dlt`'s schedule, options and cap with uniformly random actions (the ablation of learning)."""

    mode = "random"
    Settings = RandomSettings


def _agent_config(values: Mapping[str, Any]) -> AgentConfig:
    """The agent's settings among a strategy's `values`, under their own names (`random` reads no learning setting:
    None, the variant's)."""
    return AgentConfig(**{item.name: values.get(item.name) for item in dataclasses.fields(AgentConfig)})


def _tying_reward(values: Mapping[str, Any]) -> TyingReward:
    return TyingReward.for_variant(
        values["dlt_variant"], reward_block_cost=values["reward_block_cost"], reward_kind=values["reward_kind"]
    )
