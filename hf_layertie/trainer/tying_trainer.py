"""`TyingTrainer`: transformers' Trainer with Dynamic Layer Tying inside `training_step`.

Every `tying_interval` optimizer steps, on the first micro-batch of that step (so exactly once per optimizer
step, whatever the gradient accumulation), the trainer:

1. measures the loss of the steps since the last decision (the mean training loss the Trainer computed, or a
   fixed held-out batch), which is that decision's reward;
2. lets the `TyingController` learn from it and propose the next decision (rank 0), and broadcasts the map;
3. re-ties the model on every rank, then brings the optimizer (`sync_optimizer_with_model`) and the DDP
   wrapper (`rebuild_data_parallel`) in line with the model's Parameters;
4. logs the completed decision through `Trainer.log` and appends it to `tying_history.jsonl`.

`static:<spec>` applies its map at construction, `similarity:U` once after its warm-up, `none` runs the plain
Trainer. Checkpoints carry the controller (`tying_state.pt`) next to a model whose config holds that step's
map; resuming re-ties the model to the checkpoint's map before loading its weights, and is refused when the
checkpoint was saved under other tying settings (`TyingTrainingArguments.resume_settings`). A non-finite training
loss stops training before its optimizer step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..block_similarity import block_angular_distances, similarity_tying_map
from ..dlt import TyingController, make_agent
from ..model_card import write_model_card
from ..models.tied_blocks import RetieReport, TiedBlocksMixin
from ..models.tying_map import TyingMap
from ..models.tying_strategies import resolve_tying_map
from ..toolkit.checkpoints import last_complete_checkpoint
from .optimizer_sync import rebuild_data_parallel, sync_optimizer_with_model
from .tying_config import TyingTrainingArguments
from .tying_plot import plot_tying_history

logger = logging.getLogger(__name__)

TYING_STATE_NAME = "tying_state.pt"
TYING_HISTORY_NAME = "tying_history.jsonl"
TYING_PLOT_NAME = "tying_map.png"
# What `TyingTrainer._tying_state` writes.
TYING_STATE_KEYS = frozenset({"tying_strategy", "settings", "controller", "fixed_rows"})
# Where the agent's wall time goes (`TyingTrainer.tying_seconds`).
OVERHEAD_PARTS = ("reward", "decision", "retie", "optimizer_sync", "ddp_rebuild", "logging")


class TyingTrainer(Trainer):
    """A `transformers.Trainer` that learns (or fixes) which transformer blocks share weights.

    Args:
        model: a tied model (`TiedGPT2LMHeadModel`, `TiedBertForMaskedLM`, ... any `TiedBlocksMixin` model);
            any model for `tying_strategy="none"`.
        args: `TyingTrainingArguments`.
        reward_dataset: `reward_source="held_out"`: held-out examples whose first `reward_batch_size` form the
            fixed reward batch. Defaults to `eval_dataset`. Never pass the test split.
        model_card_kwargs: extra keyword arguments of `hf_layertie.model_card.build_model_card`
            (`dataset_names`, `base_model`, ...) for the card written with the final model.
        **kwargs: everything `Trainer` accepts.

    Raises:
        ValueError: from `train(resume_from_checkpoint=...)`, when the checkpoint was saved under other tying settings
            (`TyingTrainingArguments.resume_settings`) or its `tying_state.pt` cannot be read.
        FloatingPointError: from `train`, when a training loss is NaN or infinite, before that step's update.

    Attributes:
        controller: the `TyingController` of `dlt` and `random` (None otherwise).
        tying_seconds: wall time of the tying work, by part (`OVERHEAD_PARTS`); `sum(...)` is the agent's overhead.
    """

    def __init__(
        self,
        model=None,
        args: TyingTrainingArguments | None = None,
        reward_dataset=None,
        model_card_kwargs: dict | None = None,
        **kwargs,
    ):
        if not isinstance(args, TyingTrainingArguments):
            raise TypeError(f"TyingTrainer needs args of type TyingTrainingArguments, got {type(args).__name__}")
        super().__init__(model=model, args=args, **kwargs)
        self.model_card_kwargs = dict(model_card_kwargs or {})
        self.tying_seconds = dict.fromkeys(OVERHEAD_PARTS, 0.0)
        self.controller: TyingController | None = None
        self._fixed_rows: list[dict] = []  # static and similarity strategies: their one decision
        self._unwritten_rows: list[dict] = []
        self._history_started = False
        self._reward_examples = None
        self._reward_batches = None
        self._loss_not_finite: torch.Tensor | None = None  # over the micro-batches of the current optimizer step
        if args.tying_mode == "none":
            return
        self._check_model_can_tie()
        if args.tying_mode == "static":
            self.model.retie(self._parse_map_argument(args.strategy_argument, "tying_strategy"))
            self._add_fixed_row(step=0)
        elif args.is_dynamic:
            self._set_up_agent(reward_dataset)

    # ----- construction -----

    def _check_model_can_tie(self) -> None:
        if not isinstance(self.model, TiedBlocksMixin):
            raise ValueError(
                f"tying_strategy={self.args.tying_strategy!r} needs a model with tied blocks (TiedGPT2LMHeadModel, "
                f"TiedBertForMaskedLM or another TiedBlocksMixin model), got {type(self.model).__name__}; "
                f"use tying_strategy='none' for conventional training"
            )
        if self.args.tying_mode == "similarity" and self.args.similarity_distinct_blocks > len(self.model.tied_blocks):
            raise ValueError(
                f"tying_strategy={self.args.tying_strategy!r} asks for more distinct blocks than the model's "
                f"{len(self.model.tied_blocks)}"
            )

    def _parse_map_argument(self, text: str, argument: str) -> TyingMap:
        try:
            return resolve_tying_map(text, len(self.model.tied_blocks))
        except ValueError as error:
            raise ValueError(f"{argument}={text!r} does not fit the model: {error}") from None

    def _set_up_agent(self, reward_dataset) -> None:
        args = self.args
        if args.ddp_static_graph:
            raise ValueError("ddp_static_graph=True cannot follow re-ties; leave it unset with a dynamic tying_strategy")
        start = self._parse_map_argument(args.tying_initial_map or "all", "tying_initial_map")
        cap = args.max_distinct_blocks
        if cap is not None and start.num_distinct > cap:
            raise ValueError(
                f"tying_initial_map={args.tying_initial_map!r} has {start.num_distinct} blocks owning weights, more "
                f"than max_distinct_blocks={cap}"
            )
        self.model.retie(start)
        agent = make_agent(len(self.model.tied_blocks), args.agent_config(), random_actions=args.tying_mode == "random")
        self.controller = TyingController(agent, args.tying_reward())
        if args.reward_source == "held_out":
            self._reward_examples = self._select_reward_examples(reward_dataset)

    def _select_reward_examples(self, reward_dataset):
        dataset = reward_dataset if reward_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            raise ValueError("reward_dataset: several eval datasets were given; pass the held-out reward data explicitly")
        if dataset is None or len(dataset) == 0:
            raise ValueError(
                "reward_source='held_out' needs held-out data for the reward: pass reward_dataset= (or eval_dataset=), "
                "never the test split"
            )
        count = min(self.args.reward_batch_size, len(dataset))
        if hasattr(dataset, "select"):
            return self._remove_unused_columns(dataset.select(range(count)), description="reward")
        return [dataset[index] for index in range(count)]

    # ----- decisions, inside training_step -----

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self._tying_due():
            self._apply_tying_decision(inputs)
        # After a re-tie the DDP wrapper was rebuilt in place; `model_wrapped` is always the live one.
        loss = super().training_step(self.model_wrapped, inputs, num_items_in_batch)
        if self.controller is not None and self.args.reward_source == "train":
            self.controller.observe_loss(loss)
        self._stop_before_a_non_finite_update(loss)
        return loss

    def _stop_before_a_non_finite_update(self, loss: torch.Tensor) -> None:
        """Raise before the optimizer step of a NaN or infinite loss, whose gradients would make the weights NaN:
        the weights stay those of the last step, and no checkpoint or final model is written from them.

        The flag builds up on the device over the micro-batches of one optimizer step and is read on the last one:
        one device synchronisation per optimizer step (the Trainer's default `logging_nan_inf_filter` already reads
        every micro-batch's loss). Processes agree on it first, so that all stop at the same step and none updates
        or saves the weights with gradients another process made non-finite.
        """
        not_finite = ~torch.isfinite(loss.detach())
        self._loss_not_finite = not_finite if self._loss_not_finite is None else self._loss_not_finite | not_finite
        if not self.accelerator.sync_gradients:
            return
        stop, self._loss_not_finite = self._loss_not_finite, None
        if self.args.world_size > 1:
            stop = self.accelerator.reduce(stop.int(), "sum") > 0
        if stop:
            raise FloatingPointError(self._non_finite_loss_message())

    def _non_finite_loss_message(self) -> str:
        step = self.state.global_step + 1
        output_dir = self.args.output_dir
        # The checkpoint a re-run resumes from: get_last_checkpoint would name an incomplete one.
        last = last_complete_checkpoint(output_dir)
        remedy = f"a lower learning_rate (this run: {self.args.learning_rate}) or a longer warm-up"
        way_on = (
            f"To go on, resume from the last checkpoint, {last}, with {remedy}"
            if last
            else f"No checkpoint was saved yet: start again with {remedy}"
        )
        return (
            f"the training loss is not finite (NaN or inf) in step {step}: training stopped before that step's update, "
            f"so the weights are those after step {step - 1} and nothing was saved from them. {way_on}"
        )

    def train(self, *args, **kwargs):
        """`Trainer.train`, then the reward of the last decision (the loss of the steps after it)."""
        result = super().train(*args, **kwargs)
        if self.controller is not None and self.controller.pending_row is not None:
            with self._timed("reward"):
                window_loss = self._window_loss()
            completed = self.controller.finish(window_loss) if self.is_world_process_zero() else None
            if self.args.world_size > 1:
                completed = broadcast_object_list([completed], from_process=0)[0]
                self._follow_rank_zero(completed, None)
            self._log_decision(completed, None)
        self._flush_history()
        return result

    def _tying_due(self) -> bool:
        step = self.state.global_step
        if self.controller is not None:
            pending = self.controller.pending_row
            return step % self.args.tying_interval == 0 and (pending is None or pending["step"] != step)
        if self.args.tying_mode == "similarity":
            return step >= self.args.similarity_warmup_steps and not self._fixed_rows
        return False

    def _apply_tying_decision(self, inputs) -> None:
        if self.controller is not None:
            self._decide_with_agent()
        else:
            self._tie_by_similarity(inputs)

    def _decide_with_agent(self) -> None:
        step = self.state.global_step
        with self._timed("reward"):
            window_loss = self._window_loss()
        with self._timed("decision"):
            message = [None, None]
            if self.is_world_process_zero():
                completed_before = len(self.controller.rows)
                planned = max(1, math.ceil(self.state.max_steps / self.args.tying_interval))
                pending = self.controller.decide(step, self.model.tying_map, planned, window_loss)
                completed = self.controller.rows[-1] if len(self.controller.rows) > completed_before else None
                message = [pending, completed]
            if self.args.world_size > 1:
                message = broadcast_object_list(message, from_process=0)
        pending, completed = message
        self._retie(TyingMap(pending["map"]))
        pending.update(self._map_fields())
        self._follow_rank_zero(completed, pending)
        self._log_decision(completed, pending)

    def _follow_rank_zero(self, completed: dict | None, pending: dict | None) -> None:
        """On the other ranks, keep the controller's rows in step with rank 0's, where the agent decides: every
        rank then sees the same pending decision, so all join the loss reduction of `_window_loss` (a rank that
        skipped it would leave the others waiting for ever) and decide at the same steps, and `tying_records` is
        the same on every rank."""
        if self.is_world_process_zero():
            return
        if completed is not None:
            self.controller.rows.append(completed)
        self.controller.pending_row = pending

    def _tie_by_similarity(self, inputs) -> None:
        with self._timed("decision"):
            message = [None]
            if self.is_world_process_zero():
                distances = block_angular_distances(self.model, self._prepare_inputs(dict(inputs)))
                tying_map = similarity_tying_map(distances, self.args.similarity_distinct_blocks)
                message = [(tying_map.to_list(), distances)]
            if self.args.world_size > 1:
                message = broadcast_object_list(message, from_process=0)
        entries, distances = message[0]
        self._retie(TyingMap(entries))
        self._add_fixed_row(step=self.state.global_step, angular_distances=distances)

    def _add_fixed_row(self, step: int, **extra) -> None:
        row = {"index": len(self._fixed_rows), "step": step, **self._map_fields(), **extra}
        self._fixed_rows.append(row)
        self._log_decision(row, None)

    def _window_loss(self) -> float | None:
        """The loss of the steps since the pending decision: mean training loss over ranks, or the held-out batch."""
        pending = self.controller.pending_row
        if pending is None:
            return None
        if self.args.reward_source == "held_out":  # only rank 0's agent reads it
            return self._held_out_loss() if self.is_world_process_zero() else None
        window_sum = self.controller.take_window_sum()
        if self.args.world_size > 1:
            window_sum = float(self.accelerator.reduce(torch.tensor(window_sum, device=self.args.device), "mean"))
        steps = self.state.global_step - pending["step"]
        return window_sum / steps if steps > 0 else None

    @torch.no_grad()
    def _held_out_loss(self) -> float:
        """Loss of the fixed reward batch in eval mode, in chunks of one training micro-batch (so it never raises
        the memory peak), averaged over the chunks by their number of examples."""
        if self._reward_batches is None:
            examples = list(self._reward_examples)
            size = self.args.per_device_train_batch_size
            # Collate once under a forked RNG: masking collators draw random numbers, and the global RNG must not move.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.args.agent_seed)
                self._reward_batches = [
                    (self.data_collator(examples[start : start + size]), len(examples[start : start + size]))
                    for start in range(0, len(examples), size)
                ]
        model = self.model
        was_training = model.training
        model.eval()
        try:
            total = sum(float(model(**self._prepare_inputs(batch)).loss) * count for batch, count in self._reward_batches)
        finally:
            model.train(was_training)
        value = total / sum(count for _, count in self._reward_batches)
        if not math.isfinite(value):
            logger.warning(f"Held-out loss is {value} at step {self.state.global_step}; the agent will skip this reward")
        return value

    def _retie(self, tying_map: TyingMap) -> None:
        with self._timed("retie"):
            report = self.model.retie(tying_map)
        self._follow_retie(report)

    def _follow_retie(self, report: RetieReport) -> None:
        if not report.changed:
            return
        if self.optimizer is not None:
            with self._timed("optimizer_sync"):
                sync_optimizer_with_model(self.optimizer, self.model, report)
        with self._timed("ddp_rebuild"):
            rebuild_data_parallel(self.model_wrapped)

    def _map_fields(self) -> dict:
        tying_map = self.model.tying_map
        counts = self.model.parameter_counts()
        return {
            "map": tying_map.to_list(),
            "map_text": tying_map.render(),
            "distinct_blocks": tying_map.num_distinct,
            "trainable_parameters": counts.trainable,
            "block_parameters": counts.blocks,
        }

    # ----- logging and history -----

    @property
    def tying_records(self) -> list[dict]:
        """Every decision of the run in order, the pending one included: what the map was from which step."""
        return self.controller.records if self.controller is not None else list(self._fixed_rows)

    def _log_decision(self, completed: dict | None, pending: dict | None) -> None:
        """Log the decision whose reward just became known and the map now in force; queue the completed row."""
        with self._timed("logging"):
            logs = {}
            if completed is not None:
                logs.update(_numbers("tying", completed, skip=("index", "step", "block", "source")))
                self._unwritten_rows.append(completed)
            if pending is not None:
                logs.update(_numbers("tying", pending, skip=("index", "step", "block", "source")))
                logs["tying/map"] = pending["map_text"]
            elif completed is not None and "map_text" in completed:
                logs["tying/map"] = completed["map_text"]
            if logs and (self.state.global_step > 0 or self.is_in_train):
                self.log(logs)

    def _flush_history(self) -> None:
        """Append the completed rows to `tying_history.jsonl`; the first write of a fresh run starts a new file."""
        rows, self._unwritten_rows = self._unwritten_rows, []
        if not rows or not self.args.should_save:
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        with open(os.path.join(self.args.output_dir, TYING_HISTORY_NAME), "a" if self._history_started else "w") as history:
            history.writelines(json.dumps(row, allow_nan=False) + "\n" for row in rows)
        self._history_started = True

    @contextmanager
    def _timed(self, part: str):
        """Add the wall time of the block to `tying_seconds[part]`; on a GPU, after the queued kernels finish, or
        the time of asynchronous work would be charged to whatever synchronises next."""
        synchronize = torch.cuda.synchronize if self.args.device.type == "cuda" else (lambda: None)
        synchronize()
        started = time.perf_counter()
        try:
            yield
        finally:
            synchronize()
            self.tying_seconds[part] += time.perf_counter() - started

    # ----- checkpoints, resume and saving -----

    def _tying_state(self) -> dict:
        return {
            "tying_strategy": self.args.tying_strategy,
            "settings": {name: getattr(self.args, name) for name in self.args.tying_fields() if name != "tying_plot"},
            "controller": self.controller.state_dict() if self.controller is not None else None,
            "fixed_rows": self._fixed_rows,
        }

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's checkpoint, then the tying state, written last and atomically (a checkpoint with a
        `tying_state.pt` is complete; `none` writes one too, so that a tying run refuses to continue it), then the
        history so far."""
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            partial = os.path.join(folder, TYING_STATE_NAME + ".partial")
            torch.save(self._tying_state(), partial)
            os.replace(partial, os.path.join(folder, TYING_STATE_NAME))
        self._flush_history()

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        state = _read_tying_state(resume_from_checkpoint)
        self._check_resumes_the_saved_settings(resume_from_checkpoint, state)
        if self.args.tying_mode != "none":
            self.model.retie(_checkpoint_map(resume_from_checkpoint, len(self.model.tied_blocks)))
            self._restore_tying_state(state)
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        if self.args.tying_mode != "none" and self.state.best_model_checkpoint:
            self.model.retie(_checkpoint_map(self.state.best_model_checkpoint, len(self.model.tied_blocks)))
        super()._load_best_model()

    def _check_resumes_the_saved_settings(self, checkpoint: str, state: dict | None) -> None:
        """Refuse a checkpoint saved under other tying settings (`TyingTrainingArguments.resume_settings`): the run
        would continue the saved map and agent while its card reports this run's settings."""
        wanted = self.args.resume_settings()
        start_afresh = (
            f"To continue that run, repeat its settings; to start a new one, train into a new output_dir, or delete "
            f"the {PREFIX_CHECKPOINT_DIR}-* folders of {os.path.dirname(os.path.abspath(checkpoint))} (and pass no "
            f"resume_from_checkpoint)"
        )
        if state is None:
            if self.args.tying_mode != "none":
                raise ValueError(
                    f"cannot resume tying_strategy={self.args.tying_strategy!r} from {checkpoint}: it has no "
                    f"{TYING_STATE_NAME}, so a plain Trainer saved it or its save was interrupted. {start_afresh}, or "
                    f"resume from an earlier, complete checkpoint"
                )
            return
        saved = state["settings"]
        # Under another strategy the other settings are moot: name the strategy alone.
        names = ["tying_strategy"] if saved.get("tying_strategy") != wanted["tying_strategy"] else list(wanted)
        differing = [
            f"{name}={saved.get(name)!r} there, {wanted[name]!r} here"
            for name in names
            if saved.get(name) != wanted[name]
        ]
        if differing:
            raise ValueError(
                f"cannot resume from {checkpoint}: it was saved under other tying settings than this run's "
                f"({'; '.join(differing)}). {start_afresh}"
            )

    def _restore_tying_state(self, state: dict) -> None:
        if self.controller is not None:
            self.controller.load_state_dict(state["controller"])
        self._fixed_rows = list(state["fixed_rows"])
        # The history on disk restarts from the checkpoint, as the run does.
        self._unwritten_rows = list(self.controller.rows if self.controller is not None else self._fixed_rows)
        self._history_started = False
        self._flush_history()

    def _issue_warnings_after_load(self, load_result) -> None:
        # Tied blocks are not stored in the checkpoint: they are restored by sharing, not missing.
        tied = getattr(self.model, "all_tied_weights_keys", {})
        load_result.missing_keys[:] = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model; a final save (not a checkpoint's) also writes its tying plot and model card beside it."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and self.args.should_save and isinstance(self.model, TiedBlocksMixin):
            self._write_plot_and_card(Path(output_dir if output_dir is not None else self.args.output_dir))

    def create_model_card(self, model_name: str | None = None, eval_results: dict | None = None, **kwargs) -> None:
        """Write the hf-layertie card (map, distinct blocks, parameters, results, plot, loading code) as README.md.

        Called by `Trainer.push_to_hub`; `eval_results` defaults to the last evaluation in the log history.
        """
        if not isinstance(self.model, TiedBlocksMixin):
            return super().create_model_card(model_name=model_name, **kwargs)
        if self.is_world_process_zero():
            self._write_plot_and_card(Path(self.args.output_dir), model_name=model_name, eval_results=eval_results)

    def _write_plot_and_card(self, output_dir: Path, model_name: str | None = None, eval_results: dict | None = None):
        plot = None
        if self.args.tying_plot and self.tying_records:
            plot = plot_tying_history(self.tying_records, output_dir / TYING_PLOT_NAME, final_step=self.state.global_step)
        write_model_card(
            self.model,
            output_dir,
            training_args=self.args,
            eval_results=eval_results if eval_results is not None else self._last_eval_metrics(),
            tying_plot=plot,
            model_name=model_name or self.args.hub_model_id or output_dir.name,
            **self.model_card_kwargs,
        )

    def _last_eval_metrics(self) -> dict:
        evaluations = [entry for entry in self.state.log_history if "eval_loss" in entry]
        if not evaluations:
            return {}
        loss = evaluations[-1]["eval_loss"]
        return {"eval_loss": loss, "perplexity": math.exp(min(loss, 700.0))}


def _numbers(prefix: str, row: dict, skip: tuple[str, ...]) -> dict:
    """The numeric fields of `row` as `prefix/key`, for `Trainer.log` (booleans and None left out)."""
    return {
        f"{prefix}/{key}": value
        for key, value in row.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in skip
    }


def _read_tying_state(checkpoint: str) -> dict | None:
    """The checkpoint's `tying_state.pt` (None when it has none), or one error naming the file."""
    path = os.path.join(checkpoint, TYING_STATE_NAME)
    if not os.path.isfile(path):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a truncated or foreign file
        raise ValueError(f"{path} is not a readable tying state ({type(error).__name__}: {error})") from None
    if not isinstance(state, dict) or not TYING_STATE_KEYS <= state.keys():
        raise ValueError(f"{path} is not a tying state: expected a dict with the keys {sorted(TYING_STATE_KEYS)}")
    return state


def _checkpoint_map(checkpoint: str, num_blocks: int) -> TyingMap:
    """The map saved in a checkpoint's config.json (independent blocks when it has none)."""
    path = os.path.join(checkpoint, "config.json")
    with open(path) as config_file:
        entries = json.load(config_file).get("tying_map")
    try:
        return TyingMap.independent(num_blocks) if entries is None else TyingMap(entries, num_blocks=num_blocks)
    except ValueError as error:
        raise ValueError(f"cannot resume from {checkpoint}: the map in {path} does not fit this model: {error}") from None
