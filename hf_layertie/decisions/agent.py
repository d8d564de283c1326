"""`AgentDecisions`: `dlt` (a learning agent) and `random` (the same schedule and options, random actions)."""

from __future__ import annotations

import math

import torch

from ..checks import check_choice, check_integer
from ..dlt import TyingController, make_agent
from ..models.configuration_tying import TIE_INITS
from ..models.tying_map import TyingMap
from ..models.tying_strategies import resolve_tying_map
from .base import TrainingRun, TyingDecisions

REWARD_SOURCES = ("train", "held_out")
UNTIE_INITS = ("source", "own")
# The settings only a learning agent reads (`AgentConfig`'s values for each variant); `random` refuses them.
LEARNING_SETTINGS = (
    "q_gamma",
    "epsilon_start",
    "epsilon_min",
    "epsilon_decay",
    "exploration_fraction",
    "q_forgetting",
    "q_ridge",
    "q_hidden_size",
    "q_learning_rate",
    "q_weight_decay",
    "commit_after_exploration",
)


class AgentDecisions(TyingDecisions):
    """Every `tying_interval` optimizer steps, on the first micro-batch of that step, the decision pending since the
    last one gets its reward (the loss of the steps in between) and the agent proposes the next one (main process),
    which every process applies.

    The loss of a window is the mean training loss over processes (`reward_source="train"`) or the loss of a fixed
    held-out batch (`"held_out"`). A checkpoint keeps each process's part of the open window, so that a resumed
    run rewards its pending decision exactly as an uninterrupted one.
    """

    mode = "dlt"
    needs_tied_model = True
    changes_map = True
    settings = {
        # The paper's k. The embedded default run uses 4 (hf_layertie/language_modeling/defaults/clm_default.json)
        # and the study 2 (bench/settings.py): their runs are short, and k sets how many decisions a run has.
        "tying_interval": 15,
        "tying_initial_map": None,
        "max_distinct_blocks": None,
        "dlt_variant": "default",
        **dict.fromkeys(LEARNING_SETTINGS),
        "commit_after_exploration": False,
        "reward_source": "train",
        "reward_kind": None,  # the variant's
        "reward_block_cost": 0.0,
        "reward_batch_size": None,  # 16 with reward_source="held_out"
        "agent_seed": None,  # the run's --seed
        "tie_init": "root",
        "untie_init": "source",
    }

    @classmethod
    def resolve_arguments(cls, args) -> None:
        check_integer("tying_interval", args.tying_interval, minimum=1)
        check_choice("tie_init", args.tie_init, TIE_INITS)
        check_choice("untie_init", args.untie_init, UNTIE_INITS)
        if args.tying_initial_map is not None and not isinstance(args.tying_initial_map, str):
            raise ValueError(f"tying_initial_map must be a string such as 'all' or '0 0 2 2', got {args.tying_initial_map!r}")
        if args.reward_source not in REWARD_SOURCES:
            raise ValueError(f"reward_source={args.reward_source!r}: expected 'train' or 'held_out'")
        if args.reward_source == "held_out":
            args.reward_batch_size = 16 if args.reward_batch_size is None else args.reward_batch_size
            check_integer("reward_batch_size", args.reward_batch_size, minimum=1)
        elif args.reward_batch_size is not None:
            raise ValueError("reward_batch_size is only read with reward_source='held_out', not 'train'")
        if args.agent_seed is None:
            args.agent_seed = args.seed
        args.agent_config()
        args.tying_reward()
        if args.commit_after_exploration and args.dlt_variant != "default":
            raise ValueError(
                f"commit_after_exploration needs dlt_variant='default', whose exploration ends (after exploration_fraction "
                f"of the decisions); the {args.dlt_variant!r} agent's epsilon only decays towards its floor"
            )

    def __init__(self, args, num_blocks: int):
        super().__init__(args, num_blocks)
        self.initial_map = self._initial_map(num_blocks)
        agent = make_agent(num_blocks, args.agent_config(), random_actions=self.mode == "random")
        self.controller = TyingController(agent, args.tying_reward())
        self.interval = args.tying_interval
        self._window_loss_sum: torch.Tensor | float = 0.0
        self._commit_step: int | None = None  # commit_after_exploration: no decision from this step on
        # untie_init="own": each block's weights when training started, on CPU (taken by `start`).
        self._own_weights: dict[int, dict[str, torch.Tensor]] | None = None

    def _initial_map(self, num_blocks: int) -> TyingMap:
        text = self.args.tying_initial_map or "all"
        try:
            start = resolve_tying_map(text, num_blocks)
        except ValueError as error:
            raise ValueError(f"tying_initial_map={text!r} does not fit the model: {error}") from None
        cap = self.args.max_distinct_blocks
        if cap is not None and start.num_distinct > cap:
            raise ValueError(
                f"tying_initial_map={self.args.tying_initial_map!r} has {start.num_distinct} blocks owning weights, "
                f"more than max_distinct_blocks={cap}"
            )
        return start

    @property
    def records(self) -> list[dict]:
        return self.controller.records

    @property
    def completed_rows(self) -> list[dict]:
        return list(self.controller.rows)

    def start(self, run: TrainingRun) -> None:
        """Apply the initial map; with `untie_init="own"`, first keep every block's weights (a resumed run takes
        them again from the model it was given: the one its first run started from)."""
        if self.args.untie_init == "own":
            self._own_weights = run.block_weights()
        run.apply(self.initial_map, tie_init=self.args.tie_init)

    def check_run(self, max_steps: int) -> None:
        """With `commit_after_exploration`, fix the step from which no decision is taken."""
        if self.args.commit_after_exploration:
            planned = max(1, math.ceil(max_steps / self.interval))
            exploring = math.ceil(self.args.agent_config().exploration_fraction * planned)
            self._commit_step = exploring * self.interval

    def is_due(self, step: int) -> bool:
        pending = self.controller.pending_row
        committed = self._commit_step is not None and step >= self._commit_step
        return step % self.interval == 0 and not committed and (pending is None or pending["step"] != step)

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Add a training loss to the window without synchronising the device."""
        if self.args.reward_source == "train":
            self._window_loss_sum = self._window_loss_sum + loss.detach()

    def decide(self, run: TrainingRun) -> None:
        with run.timed("reward"):
            window_loss = self._window_loss(run)
        with run.timed("decision"):
            message = None
            if run.is_main_process:
                planned = max(1, math.ceil(run.max_steps / self.interval))
                message = self.controller.decide(run.step, run.tying_map, planned, window_loss)
            completed, pending = run.broadcast(message)
            if not run.is_main_process:
                self.controller.follow(completed, pending)
        pending.update(run.apply(TyingMap(pending["map"]), untied_weights=self._own_weights))
        run.log(completed, pending)

    def finish(self, run: TrainingRun) -> None:
        if self.controller.pending_row is None:
            return
        with run.timed("reward"):
            window_loss = self._window_loss(run)
        completed = self.controller.finish(window_loss) if run.is_main_process else None
        completed = run.broadcast(completed)
        if not run.is_main_process:
            self.controller.follow(completed, None)
        run.log(completed, None)

    def _window_loss(self, run: TrainingRun) -> float | None:
        """The loss of the steps since the pending decision (None when nothing is pending or no step was taken).

        Every process joins the reduction, so all must call it at the same step: they do, because every process
        keeps the same pending decision (`TyingController.follow`)."""
        pending = self.controller.pending_row
        if pending is None:
            return None
        if self.args.reward_source == "held_out":  # only the main process's agent reads it
            return run.held_out_loss() if run.is_main_process else None
        window_sum, self._window_loss_sum = float(self._window_loss_sum), 0.0
        window_sum = run.mean_over_processes(window_sum)
        steps = run.step - pending["step"]
        return window_sum / steps if steps > 0 else None

    def state_dict(self, run: TrainingRun) -> dict:
        """The controller, and the open window's loss sum of every process, by rank (collective)."""
        return {**self.controller.state_dict(), "window_loss_sums": run.gather(float(self._window_loss_sum))}

    def load_state_dict(self, state: dict, run: TrainingRun) -> None:
        """Restore a checkpoint; each process takes back its own part of the open window (the mean of them all when
        the run resumes on another number of processes: the window's mean over processes is then kept)."""
        state = dict(state)
        sums = state.pop("window_loss_sums")
        self.controller.load_state_dict(state)
        self._window_loss_sum = sums[run.process_index] if len(sums) == run.num_processes else sum(sums) / len(sums)


class RandomDecisions(AgentDecisions):
    """`random`: `dlt`'s schedule, options and cap with uniformly random actions (the ablation of learning)."""

    mode = "random"
    settings = {name: default for name, default in AgentDecisions.settings.items() if name not in LEARNING_SETTINGS}
