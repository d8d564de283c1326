"""`TyingEngine`: a tying strategy applied to a model in training, with no Trainer around it.

The strategy (`hf_layertie.decisions`) says when a decision is due and what it is, from what it observes
(`Observation`); the engine does the rest, in one place (`take`). When a decision is due (`decide_if_due`, called
once per optimizer step, on its first micro-batch), every process runs the strategy, the main process's `Decision`
is sent to the others, every process re-ties its model and brings the optimizer (`sync_optimizer_with_model`) and
the data-parallel wrapper (the `refresh_wrapper` it was given) in line with the model's Parameters, and the decision
enters the run's history (`TyingHistory`, `tying_history.jsonl`) and the log (the `log` it was given).

It is Trainer-free so that one engine serves `TyingTrainer` and a plain training loop alike: what it needs of the
loop comes in as callables (the optimizer, which the Trainer builds after the engine; the wrapper's refresh; the
reward's held-out loss; the inputs' preparation; the step), and what it needs of the other processes as a
`hf_layertie.engine.Processes`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ..block_similarity import block_angular_distances
from ..decisions import Decision, Observation, TyingDecisions
from ..models._compat import carries_integrated_adapters
from ..models.adapter_export import is_adapter_layer
from ..models.tied_blocks import ParameterCounts, TiedBlocksMixin
from ..models.tying_map import TyingMap
from ..relaxed_ties import holds_adapters, load_relaxed_weights, relax_ties
from .optimizer_sync import add_to_optimizer, sync_optimizer_with_model
from .processes import Processes
from .tying_history import TyingHistory

# Where the agent's wall time goes (`TyingEngine.tying_seconds`).
OVERHEAD_PARTS = ("reward", "decision", "retie", "optimizer_sync", "ddp_rebuild", "logging")
# Row fields that are not measurements (left out of the log).
_ROW_LABELS = ("index", "step", "block", "source")


class TyingEngine:
    """A tying strategy's decisions, taken on a model in training: the map, the optimizer and the wrapper kept in step.

    Args:
        model: the model the decisions re-tie (a `TiedBlocksMixin` model; any model when the strategy ties nothing).
        decisions: the strategy (`hf_layertie.decisions.TyingDecisions`) owning the run's tying decisions.
        processes: the run's processes (`hf_layertie.engine.Processes`), for the collectives of a decision.
        output_dir: where `tying_history.jsonl` is written.
        optimizer: returns the optimizer in use, or None before one exists (the Trainer builds it once training
            starts, after the engine).
        refresh_wrapper: brings the data-parallel wrapper around the model in line after its Parameters changed
            (`hf_layertie.engine.optimizer_sync.rebuild_data_parallel` for DDP; a no-op without a wrapper).
        held_out_loss: the loss of the fixed reward batch, for strategies rewarded on held-out data.
        prepare_inputs: puts a micro-batch on the model's device, for the blocks' angular distances.
        steps: returns the optimizer step reached and the run's last step (`global_step`, `max_steps`).
        log: receives each decision's numbers (`tying/...`) when its outcome is known, and the map in force.
        keep_starting_weights: keep a CPU copy of each block's weights now, which an agent's decision that unties a
            block restores (`untie_init="own"`).
        retie: how the model is re-tied: None (the default) re-ties it in place (`model.retie`) and syncs the
            optimizer; else a policy, `retie(model, optimizer, new_map)`, that re-ties and carries the optimizer itself
            and returns the model to use from then on (`hf_layertie.sharding.ShardedRetie` under FSDP2): the engine
            makes it its `model`, so a loop reads `engine.model` after each decision. A policy's `check(settings)`, if
            it has one, refuses the strategy's settings it cannot serve (a ValueError, when the engine is built).

    Attributes:
        decisions: the strategy.
        history: the run's decisions (`TyingHistory`).
        tying_seconds: wall time of the tying work since the engine was built, by part (`OVERHEAD_PARTS`); `sum(...)`
            is the agent's overhead.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        decisions: TyingDecisions,
        processes: Processes,
        *,
        output_dir: str,
        optimizer: Callable[[], torch.optim.Optimizer | None],
        refresh_wrapper: Callable[[], None],
        held_out_loss: Callable[[], float],
        prepare_inputs: Callable[[dict], dict],
        steps: Callable[[], tuple[int, int]],
        log: Callable[[dict], None],
        keep_starting_weights: bool = False,
        retie: Callable[[torch.nn.Module, torch.optim.Optimizer | None, TyingMap], torch.nn.Module] | None = None,
    ):
        self.model = model
        self._retie = retie
        if retie is not None and hasattr(retie, "check"):
            retie.check(dataclasses.asdict(decisions.settings))
        self.decisions = decisions
        self.processes = processes
        self.history = TyingHistory(output_dir)
        self.tying_seconds = dict.fromkeys(OVERHEAD_PARTS, 0.0)
        self._optimizer = optimizer
        self._refresh_wrapper = refresh_wrapper
        self._held_out_loss = held_out_loss
        self._prepare_inputs = prepare_inputs
        self._steps = steps
        self._log = log
        self._run_checked = False
        # untie_init="own": each block's weights when training started, on CPU (a resumed run takes them again from
        # the model it was given: the one its first run started from).
        self._starting_weights = self.block_weights() if keep_starting_weights else None

    @property
    def tying_records(self) -> list[dict]:
        """Every decision of the run in order as log rows, the one in force included: what the map was from which step."""
        return self.history.rows

    def observation(self, inputs: dict | None = None) -> Observation:
        """The run as the strategy sees it now; `inputs`, the current micro-batch, for `block_distances`."""
        step, max_steps = self._steps()
        return Observation(
            step=step,
            max_steps=max_steps,
            tying_map=self.model.tying_map if isinstance(self.model, TiedBlocksMixin) else None,
            current=self.history.current,
            is_main_process=self.processes.is_main_process,
            process_index=self.processes.process_index,
            num_processes=self.processes.num_processes,
            held_out_loss=self._held_out_loss,
            block_distances=functools.partial(self.block_distances, inputs),
            mean_over_processes=self.processes.mean,
            gather=self.processes.gather,
        )

    # ----- decisions -----

    def start(self) -> Decision | None:
        """The strategy's starting map (every block tied to block 0 for DLT, the fixed map of `static:...`), taken
        before the first step; None where the model keeps its map."""
        decision = self.decisions.start(self.observation())
        if decision is not None:
            self.take(decision)
        return decision

    def observe_loss(self, loss: torch.Tensor) -> None:
        """A micro-batch's training loss, from which the strategy's reward is computed (on the device, as it comes:
        no synchronisation per step)."""
        self.decisions.observe_loss(loss)

    def decide_if_due(self, inputs: dict | None = None) -> None:
        """The decision step, on the first micro-batch of an optimizer step (so exactly once per optimizer step,
        whatever the gradient accumulation): when the strategy says one is due, every process runs it, the main
        process's decision reaches every process, and each takes it (collective)."""
        step, max_steps = self._steps()
        if not self._run_checked:  # the run's length is known once training starts (the Trainer's max_steps)
            self.decisions.check_run(max_steps)
            self._run_checked = True
        if not self.decisions.is_due(step, self.history.current):
            return
        self.processes.synchronize()  # the strategy's timings start here, not with the queued training kernels
        decision = self.processes.on_every_process(lambda: self.decisions.decide(self.observation(inputs)), step)
        with self.timed("decision"):
            decision = self.processes.broadcast(decision)
        if decision is not None:
            self.take(decision)

    def take(self, decision: Decision) -> None:
        """Apply `decision` to the model, then complete the decision it replaces, record it and log them: the one
        place a decision reaches the model and the history."""
        counts = self.apply(decision)
        decision = dataclasses.replace(decision, trainable_parameters=counts.trainable, block_parameters=counts.blocks)
        for part, seconds in decision.seconds.items():
            self.tying_seconds[part] += seconds
        if decision.index is None:  # a starting map outside the history
            return
        completed = None
        if decision.previous_outcome is not None:
            completed = self.history.complete(decision.previous_outcome)
        self.history.record(decision)
        if decision.completed:
            self._log_decision(decision, None)
        else:
            self._log_decision(completed, decision)

    def apply(self, decision: Decision) -> ParameterCounts:
        """Re-tie the model to `decision`'s map, bring the optimizer and the DDP wrapper along, and return the
        model's parameter counts.

        `tie_init` as in `retie`; with `untie_to_start`, the block an agent's decision unties takes back its weights
        from when training started, with fresh optimizer state (`untie_init="own"`); `lora_rank` relaxes the new ties
        (`relax_ties`), whose adapters join the param group of the weights they adapt. A re-tie policy (`retie`)
        applies the map alone: its `check` refused at construction the settings it cannot serve, and a decision's
        `tie_init`, `lora_rank` and `untie_to_start` are those settings'."""
        if self._retie is not None:
            self._retie_by_policy(decision.map_after)
            return self.model.parameter_counts()
        lora_rank, lora_init = decision.lora_rank, decision.lora_init
        untied_weights = self._starting_weights if decision.untie_to_start else None
        weights_before = self.block_weights() if lora_init == "svd" else None
        with self.timed("retie"):
            report = self.model.retie(decision.map_after, tie_init=decision.tie_init)
            restored = [
                parameter
                for block in (_block_untied(decision, report.old_map) if untied_weights is not None else [])
                for parameter in _load_block_weights(self.model.tied_blocks[block], untied_weights[block])
            ]
        optimizer = self._optimizer()
        if report.changed and optimizer is not None:
            with self.timed("optimizer_sync"):
                sync_optimizer_with_model(optimizer, self.model, report)
                for parameter in restored:
                    getattr(optimizer, "optimizer", optimizer).state.pop(parameter, None)
        if lora_rank is not None:
            self.relax(lora_rank, lora_init, weights_before)
        if report.changed or lora_rank is not None:
            with self.timed("ddp_rebuild"):
                self._refresh_wrapper()
        return self.model.parameter_counts()

    def relax(self, lora_rank: int, lora_init: str, weights_before: dict | None) -> None:
        """Add the adapters of relaxed ties; mid-run (similarity decides at its first step), also into the optimizer,
        in the group of the weights they adapt (the caller rebuilds the DDP wrapper)."""
        adapters = relax_ties(self.model, lora_rank, lora_init, weights_before)
        optimizer = self._optimizer()
        if optimizer is not None:
            adapted = next(module for module in self.model.tied_blocks.modules() if is_adapter_layer(module))
            add_to_optimizer(optimizer, self.model, adapters, like=adapted.base_layer.weight)

    def load_relaxed_checkpoint(self, checkpoint: str, lora_rank: int | None) -> bool:
        """Load `checkpoint`'s weights when they are relaxed ties' (this run's, `lora_rank`, or those of a relaxed
        folder trained on as it is): the tied base and its adapters, which the model gets first if it has none yet.
        False for a plain checkpoint (one saved before the map was applied, as in similarity's warm-up: the adapters
        come when the run applies the map), which the caller loads."""
        relaxed = lora_rank is not None or carries_integrated_adapters(self.model)
        if not (relaxed and holds_adapters(checkpoint)):
            return False
        if not carries_integrated_adapters(self.model):
            self.relax(lora_rank, "zero", None)  # into an optimizer passed in, too
        load_relaxed_weights(self.model, checkpoint)
        return True

    def finish_decisions(self, write: bool) -> None:
        """Give the decision still pending its outcome (the loss of the steps after it), log it and write the history
        (`write`: on the process that saves)."""
        if self.history.pending is not None:  # the same on every process: all join the collectives or none
            step, _ = self._steps()
            with self.timed("reward"):
                outcome = self.processes.on_every_process(lambda: self.decisions.finish(self.observation()), step)
            outcome = self.processes.broadcast(outcome)
            if outcome is not None:
                self._log_decision(self.history.complete(outcome), None)
        self.history.flush(write)

    def retie_to(self, tying_map: TyingMap) -> None:
        """Re-tie the model to `tying_map` (a checkpoint's), bringing along an optimizer that exists already (one
        passed in, or the Trainer's when the best model is loaded at the end) and the wrapper. Collective."""
        if self._retie is not None:
            self._retie_by_policy(tying_map)
            return
        report = self.model.retie(tying_map)
        optimizer = self._optimizer()
        if report.changed and optimizer is not None:
            sync_optimizer_with_model(optimizer, self.model, report)
        if report.changed:
            self._refresh_wrapper()

    def _retie_by_policy(self, tying_map: TyingMap) -> None:
        """Re-tie through the policy given at construction, which brings the optimizer along and returns the model
        the engine holds from now on (unchanged map: nothing to do, on every process alike)."""
        tying_map = TyingMap(tying_map)
        if tying_map == self.model.tying_map:
            return
        with self.timed("retie"):
            self.model = self._retie(self.model, self._optimizer(), tying_map)
        with self.timed("ddp_rebuild"):
            self._refresh_wrapper()

    # ----- state -----

    def state_dict(self) -> dict:
        """The decisions' part of the tying state: the history's rows beside the strategy's state (collective: every
        process calls it, see `TyingDecisions.state_dict`)."""
        return {**self.history.state_dict(), **self.decisions.state_dict(self.observation())}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned: the strategy's state beside the run's decisions (their keys as
        `TyingHistory.state_dict` writes them)."""
        saved = dict(state)
        self.history.load_state_dict({"rows": saved.pop("rows"), "pending_row": saved.pop("pending_row")})
        self.decisions.load_state_dict(saved, self.observation())

    # ----- logging, timing and what the strategy observes -----

    def _log_decision(self, completed: Decision | None, current: Decision | None) -> None:
        """Log the decision whose outcome just became known and the map now in force."""
        with self.timed("logging"):
            logs = {}
            for decision in (completed, current):
                if decision is not None:
                    logs.update(_numbers("tying", decision.to_row(), skip=_ROW_LABELS))
                    logs["tying/map"] = decision.map_after.render()
            if logs:
                self._log(logs)

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Add the wall time of the block to `tying_seconds[part]`; on a GPU, after the queued kernels finish, or
        the time of asynchronous work would be charged to whatever synchronises next."""
        self.processes.synchronize()
        started = time.perf_counter()
        try:
            yield
        finally:
            self.processes.synchronize()
            self.tying_seconds[part] += time.perf_counter() - started

    @torch.no_grad()
    def block_weights(self) -> dict[int, dict[str, torch.Tensor]]:
        """A CPU copy of the weights every block computes with now, by block and name (blocks that share weights
        share one copy)."""
        copies: dict[torch.nn.Parameter, torch.Tensor] = {}

        def copied(parameter: torch.nn.Parameter) -> torch.Tensor:
            if parameter not in copies:
                copies[parameter] = parameter.detach().to("cpu", copy=True)
            return copies[parameter]

        blocks = self.model.tied_blocks
        return {index: {name: copied(parameter) for name, parameter in block.named_parameters()} for index, block in enumerate(blocks)}

    def block_distances(self, inputs: dict) -> list[float]:
        """Each block's angular distance on the micro-batch `inputs` (`hf_layertie.block_similarity`)."""
        return block_angular_distances(self.model, self._prepare_inputs(dict(inputs)))


def _numbers(prefix: str, row: dict, skip: tuple[str, ...]) -> dict:
    """The numeric fields of `row` as `prefix/key`, for the log (booleans and None left out)."""
    return {
        f"{prefix}/{key}": value
        for key, value in row.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in skip
    }


def _block_untied(decision: Decision, old_map: TyingMap) -> list[int]:
    """The block an agent's decision unties (`source == block`, tied before), or none. It is the only block whose
    weights change (`TyingMap.with_decision`): a decision that ties an owner instead leaves its followers their
    trained weights and optimizer state under a new owner, though they too become independent in the new map."""
    untie = decision.block is not None and decision.source == decision.block and not old_map.is_independent(decision.block)
    return [decision.block] if untie else []


@torch.no_grad()
def _load_block_weights(block: torch.nn.Module, weights: dict[str, torch.Tensor]) -> list[torch.nn.Parameter]:
    """Copy `weights` (by name within the block) into `block`'s Parameters; returns those Parameters."""
    parameters = dict(block.named_parameters())
    for name, value in weights.items():
        parameters[name].copy_(value)
    return [parameters[name] for name in weights]
