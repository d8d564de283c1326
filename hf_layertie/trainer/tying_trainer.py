"""`TyingTrainer`: transformers' Trainer with a tying strategy inside `training_step`.

The strategy (`hf_layertie.decisions`, chosen by `TyingTrainingArguments.tying_strategy`) decides and the tying
engine (`hf_layertie.engine.TyingEngine`) takes its decisions: on the first micro-batch of an optimizer step where a
decision is due (so exactly once per optimizer step, whatever the gradient accumulation), the main process's
`Decision` reaches every process, each re-ties its model and brings the optimizer and the DDP wrapper
(`rebuild_data_parallel`) in line, and the decision enters the run's history (`tying_history.jsonl`) and
`Trainer.log`. The trainer is the glue: it hands the engine the Trainer's optimizer, wrapper, accelerator
(`hf_layertie.engine.AcceleratorProcesses`) and held-out reward batch, and keeps the engine's state in its
checkpoints. The refusals of settings that cannot work are in `guards`.
Checkpoints carry the strategy's state (`checkpoint_format`) next to a model whose config holds that step's map;
resuming re-ties the model to the checkpoint's map before loading its weights, and is refused when the checkpoint
was saved under other tying settings (`TyingTrainingArguments.resume_settings`). The final model is saved with its
tying state too, so that a run whose last outputs were lost is finished from it without training a step more.
Checkpoints also carry the run's training totals (`TrainingTotals`), so that a resumed run reports the whole run's
training loss, runtime and speeds.

With `distill_from`, the loss is the mix of the next-token loss and the KL from a frozen teacher
(`hf_layertie.trainer.distillation`): the teacher lives beside the model, not in it, so it never reaches the
optimizer, the DDP wrapper or a checkpoint, and a resumed run loads it again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints

from ..checks import perplexity
from ..decisions import TyingDecisions
from ..engine import OVERHEAD_PARTS, TyingEngine, TyingHistory
from ..engine.block_learning_rates import split_by_block_uses
from ..engine.optimizer_sync import check_data_parallel_can_rebuild, rebuild_data_parallel
from ..engine.processes import AcceleratorProcesses
from ..model_card import write_model_card
from ..models._compat import (
    carries_integrated_adapters,
    check_trainer_private_api,
    declared_tied_weights,
    prepare_inputs,
    remove_unused_columns,
    trainer_output_dir,
)
from ..models.tied_blocks import TiedBlocksMixin
from ..relaxed_ties import check_lora_rank, holds_adapters, load_relaxed_weights
from .checkpoint_format import (
    TYING_STATE_NAME,
    check_checkpoint_readable,
    check_resumes_starting_model,
    check_tying_state_belongs,
    checkpoint_digest,
    checkpoint_step,
    checkpoint_tying_map,
    explain_write_errors,
    finished_training_step,
    last_complete_checkpoint,
    read_tying_state,
    starting_model,
    write_tying_state,
)
from .compilation import compile_regionally
from .distillation import start_distillation
from .guards import (
    check_model_can_tie,
    check_resumes_saved_settings,
    checked_card_kwargs,
    matplotlib_installed,
    refuse_engine,
    refuse_loop_lr_without_own_optimizer,
    refuse_loop_onset_without_loops,
    refuse_model_init,
    refuse_moving_relaxed_ties,
    refuse_trainer_settings_that_cannot_follow_reties,
    refuse_unread_reward_dataset,
    report_to_installed_tensorboard_only,
    set_aside,
)
from .held_out_reward import HeldOutReward, select_reward_examples
from .loop_schedule import skipped_over_training, skipped_positions_at
from .non_finite_loss import NonFiniteLossGuard
from .training_args import LOOP_SETTINGS, TyingTrainingArguments
from .training_totals import TrainingTotals
from .tying_plot import TYING_PLOT_NAME, plot_tying_history

logger = logging.getLogger(__name__)
# The private Trainer methods below override or call (`_compat.TRAINER_PRIVATE_API`): a rename fails here, by name.
check_trainer_private_api(Trainer)

__all__ = ["OVERHEAD_PARTS", "TYING_PLOT_NAME", "TyingTrainer", "check_resumes_saved_settings"]


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
        **kwargs: everything `Trainer` accepts, but `model_init` with a strategy that ties.

    Raises:
        ValueError: when built with `model_init` for a strategy that ties, or with a tied model under FSDP or
            DeepSpeed (neither follows a re-tie); from `train(resume_from_checkpoint=...)`, when the checkpoint was
            saved under other tying settings (`TyingTrainingArguments.resume_settings`) or its `tying_state.pt` cannot
            be read; from `train`, when the strategy cannot serve the run (a similarity warm-up as long as the run).
        FloatingPointError: from `train`, when a training loss or the gradient norm is NaN or infinite, before that
            step's update.

    Attributes:
        engine: the tying engine (`hf_layertie.engine.TyingEngine`) taking the strategy's decisions on the model;
            `decisions`, `history` (with `tying_records`) and `tying_seconds` are its own.
        decisions: the strategy (`hf_layertie.decisions.TyingDecisions`) owning the run's tying decisions.
        history: the run's decisions (`TyingHistory`), and `tying_records`, the same as log rows.
        tying_seconds: wall time of the tying work since this trainer was built, by part (`OVERHEAD_PARTS`);
            `sum(...)` is the agent's overhead. A resumed run's counts this sitting only (the training metrics count
            the whole run).
        distillation: with `distill_from`, the teacher and the loss (`Distillation`, also `compute_loss_func`);
            else None.
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
        refuse_engine(model, "FSDP", bool(args.fsdp))
        refuse_model_init(args, kwargs.get("model_init"))
        refuse_unread_reward_dataset(args, reward_dataset)
        report_to_installed_tensorboard_only(args)
        super().__init__(model=model, args=args, **kwargs)
        refuse_engine(self.model, "FSDP", self.is_fsdp_enabled)  # accelerate's plugin (`accelerate launch --use_fsdp`)
        refuse_engine(self.model, "DeepSpeed", self.is_deepspeed_enabled)
        self.model_card_kwargs = checked_card_kwargs(model_card_kwargs)
        self._non_finite_loss = NonFiniteLossGuard()
        self._run_checked = False
        self._held_out_reward: HeldOutReward | None = None
        self._best_step_loaded: int | None = None  # the best checkpoint's step, once its model is loaded at the end
        # The run's training totals: those of the checkpoint resumed from, plus the sitting in `train` (its summed
        # loss and start), if one is under way.
        self._totals = TrainingTotals()
        self._sitting_loss = 0.0
        self._sitting_start: float | None = None
        decisions_class = args.decisions_class
        if decisions_class.needs_tied_model:
            check_model_can_tie(self.model, args.tying_strategy)
        self._draws_plot = args.tying_plot and decisions_class.needs_tied_model and matplotlib_installed()
        refuse_trainer_settings_that_cannot_follow_reties(args)
        num_blocks = len(self.model.tied_blocks) if isinstance(self.model, TiedBlocksMixin) else 0
        decisions = decisions_class(args, num_blocks)
        if args.lora_rank is not None:  # static and similarity: before the map is applied (similarity's after a warm-up)
            check_lora_rank(self.model, args.lora_rank, decisions.num_distinct)
        if args.reward_source == "held_out":
            self._held_out_reward = HeldOutReward(
                select_reward_examples(
                    reward_dataset if reward_dataset is not None else self.eval_dataset,
                    args.reward_batch_size,
                    lambda dataset: remove_unused_columns(self, dataset, description="reward"),
                ),
                collate=lambda examples: self.data_collator(examples),
                batch_size=args.per_device_train_batch_size,
                seed=args.agent_seed,
                prepare_inputs=lambda inputs: prepare_inputs(self, inputs),
                step=lambda: self.state.global_step,
            )
        self.engine = TyingEngine(
            self.model,
            decisions,
            AcceleratorProcesses(lambda: self.accelerator, args.device),
            output_dir=args.output_dir,
            optimizer=lambda: self.optimizer,
            refresh_wrapper=lambda: rebuild_data_parallel(self.model_wrapped),
            held_out_loss=self.held_out_loss,
            prepare_inputs=lambda inputs: prepare_inputs(self, inputs),
            steps=lambda: (self.state.global_step, self.state.max_steps),
            log=self._log_tying,
            keep_starting_weights=args.untie_init == "own",
        )
        self.distillation = start_distillation(args, self.model, self.processing_class, self.compute_loss_func)
        if self.distillation is not None:
            # The mixed loss is the Trainer's `compute_loss_func`, so that the Trainer counts the scored tokens and
            # scales the loss as it does the model's own (the count spans the accumulated micro-batches and the
            # processes: the mix averages exactly).
            self.compute_loss_func = self.distillation
        start = self.decisions.start(self.engine.observation())
        refuse_moving_relaxed_ties(self.model, args.tying_strategy, decisions_class.changes_map, start)
        refuse_loop_onset_without_loops(self.model, args.loop_onset)
        refuse_loop_lr_without_own_optimizer(self.model, args.loop_lr_exponent, self.optimizer)
        if start is not None:
            self.engine.take(start)

    # ----- the tying engine's, as attributes of the trainer -----

    @property
    def decisions(self) -> TyingDecisions:
        """The strategy (`hf_layertie.decisions.TyingDecisions`) owning the run's tying decisions."""
        return self.engine.decisions

    @property
    def history(self) -> TyingHistory:
        """The run's decisions (`TyingHistory`), written to `tying_history.jsonl`."""
        return self.engine.history

    @property
    def tying_seconds(self) -> dict[str, float]:
        """Wall time of the tying work since this trainer was built, by part (`OVERHEAD_PARTS`)."""
        return self.engine.tying_seconds

    @property
    def tying_records(self) -> list[dict]:
        """Every decision of the run in order as log rows, the one in force included: what the map was from which step."""
        return self.engine.tying_records

    def _log_tying(self, logs: dict) -> None:
        """The engine's decision logs, through `Trainer.log`: once training started (a starting map is not logged)."""
        if self.state.global_step > 0 or self.is_in_train:
            self.log(logs)

    # ----- construction -----

    def _build_accelerator_args(self, **kwargs) -> dict:
        """`Trainer`'s accelerator arguments; with `torch_compile` on a tied model, a dynamo plugin that compiles each
        block on its own (accelerate's regional compilation), so that a re-tie does not recompile (`compilation`)."""
        accelerator_args = super()._build_accelerator_args(**kwargs)
        if self.args.torch_compile and isinstance(self.model, TiedBlocksMixin):
            compile_regionally(accelerator_args.get("dynamo_plugin"), self.args.use_cache)
        return accelerator_args

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """`Trainer.compute_loss`; distilling, the teacher first scores the micro-batch. Only in training: evaluation
        (the model in eval mode) keeps the student's next-token loss."""
        if self.distillation is not None and model.training:
            self.distillation.observe(inputs)
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    # ----- decisions, inside training_step -----

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self._run_checked:
            # Re-ties rebuild the DDP wrapper; a fixed map (relaxed or not) is applied before the Trainer wraps it.
            if self.args.decisions_class.changes_map:
                check_data_parallel_can_rebuild(self.model_wrapped)
            self._run_checked = True
        self.engine.decide_if_due(inputs)
        if self.args.loop_onset is not None:
            self._schedule_loops()
        # After a re-tie the DDP wrapper was rebuilt in place; `model_wrapped` is always the live one.
        loss = super().training_step(self.model_wrapped, inputs, num_items_in_batch)
        self._sitting_loss += loss  # on the device, as the Trainer sums it: no synchronisation per step
        self.engine.observe_loss(loss)
        self._non_finite_loss.observe(loss)
        return loss

    def _schedule_loops(self) -> None:
        """This step's depth (`loop_onset`, `loop_schedule`): the positions it skips, set in the model's config, which
        its forward passes, evaluations and saves read. A function of the step and the map alone, so a resumed run
        computes what the uninterrupted one does; from the onset on, every position computes."""
        self.model.config.skipped_positions = skipped_positions_at(
            self.state.global_step, self.state.max_steps, self.model.tying_map, self.args.loop_onset, self.args.loop_schedule
        )

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """The Trainer's optimizer; under `loop_lr_exponent`, its groups split by block use count, each at its own
        learning rate (`split_by_block_uses`), before the learning-rate scheduler reads them."""
        built_here = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if built_here and self.args.loop_lr_exponent is not None:
            split_by_block_uses(optimizer, self.model, self.args.loop_lr_exponent)
        return optimizer

    def _skipped_over_training(self) -> list[dict]:
        """The positions the run's steps skipped, as change points for the plot (`skipped_over_training`)."""
        args = self.args
        fixed = None if args.loop_onset is not None else self.model.config.skipped_positions
        return skipped_over_training(self.tying_records, self.state.global_step, self.state.max_steps, args.loop_onset, args.loop_schedule, fixed)

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's gradient norm, measured before `optimizer.step()`: the step's losses and this norm are
        checked there (`NonFiniteLossGuard.check`), so no update, checkpoint or model is made of NaN weights."""
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        self._non_finite_loss.check(grad_norm, self.accelerator, self.state.global_step, self.args.output_dir, self.args.learning_rate)
        return grad_norm

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs) -> TrainOutput:
        """`Trainer.train`, then the strategy's last reward (the loss of the steps after the last decision).

        The training metrics (`train_loss`, `train_runtime`, `train_*_per_second`, `total_flos`) are the whole
        run's, over every sitting (`TrainingTotals`): resumed from a checkpoint, the mean loss of all the steps
        since the start, not of those this call trained; the Trainer's closing entry of `log_history` is given the
        same numbers. A checkpoint that already reached `max_steps`, or the last step of its `num_train_epochs`
        (or the output folder of a finished run), is not trained further: the model, the decisions and the trainer state are
        restored from it, and the run ends there with the metrics it had. `resume_from_checkpoint=True` resumes
        from the last complete checkpoint in `output_dir` (one a crash left without its tying state is skipped).
        """
        if resume_from_checkpoint is True:  # transformers would take the highest-numbered folder, complete or not
            last = last_complete_checkpoint(self.args.output_dir)
            if last is None:
                raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint in {self.args.output_dir}")
            resume_from_checkpoint = str(last)
        if isinstance(resume_from_checkpoint, os.PathLike):
            resume_from_checkpoint = os.fspath(resume_from_checkpoint)
        finished = isinstance(resume_from_checkpoint, str) and finished_training_step(
            resume_from_checkpoint, self.args.max_steps, self.args.num_train_epochs
        ) is not None
        # Resuming loads the checkpoint's totals; a sitting an earlier call left unfinished (it raised) is not one.
        self._totals, self._sitting_loss, self._sitting_start = TrainingTotals(), 0.0, None
        if finished:
            metrics = self._finish_from(resume_from_checkpoint)
        else:
            self._sitting_start = time.time()
            # The Trainer's closing log entry ended the sitting (`log`): `_totals` are the run's.
            metrics = super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs).metrics
            self._finish_decisions()
        metrics.update(self._totals.metrics(self.state.global_step, self._samples_per_step(), self.state.total_flos))
        if self.distillation is not None:
            metrics["teacher_parameters_mib"] = self.distillation.parameters_mib
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """`Trainer.log`; the closing entry of a sitting (`train_runtime`, `train_loss`, speeds), which `Trainer.train`
        computes over this sitting's steps only, carries the whole run's instead: the console, the trackers and
        `trainer_state.json` show the numbers `train` returns. Collective, as the closing entry is logged by all."""
        if "train_runtime" not in logs or self._sitting_start is None:
            super().log(logs, start_time)
            return
        # The sitting ends here (its loss summed over processes once); `train` then finds the totals closed.
        self._totals, self._sitting_start = self._training_totals(logs["train_runtime"]), None
        whole_run = {**logs, **self._totals.metrics(self.state.global_step, self._samples_per_step(), self.state.total_flos)}
        super().log(whole_run, start_time)
        # What `Trainer.log` adds (`epoch`, tokens seen) reaches the metrics `train` returns, as without the override;
        # the sitting's own numbers stay in them (`train` adds the run's from them).
        logs.update({key: value for key, value in whole_run.items() if key not in logs})

    def _finish_from(self, checkpoint: str) -> dict[str, float]:
        logger.warning(f"{checkpoint} is at max_steps={self.args.max_steps} already: finishing the run from it, training no step")
        self._load_from_checkpoint(checkpoint)
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
        self._finish_decisions()
        # From the last checkpoint, as the run would have ended uninterrupted; a finished run's output folder holds
        # the best model already. A best checkpoint gone since is left, as the Trainer leaves it (with a warning).
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and Path(checkpoint).name.startswith(PREFIX_CHECKPOINT_DIR):
            if os.path.isdir(best):
                self._load_best_model()
            else:
                logger.warning(f"Could not find the best model at {best}: the run ends on {checkpoint}'s model")
        elif self.args.load_best_model_at_end and best is not None:  # the folder's model: the best, as its run ended
            self._best_step_loaded = self.state.best_global_step
        return {"epoch": self.state.epoch}

    def _training_totals(self, sitting_runtime: float | None = None) -> TrainingTotals:
        """The run's totals up to now: the checkpoint's resumed from, plus the sitting under way (collective). Its
        runtime is `sitting_runtime` when it is over (`Trainer.train`'s own measure), else the time since it began."""
        if self._sitting_start is None:
            return self._totals
        loss_sum = self.engine.processes.mean(float(self._sitting_loss))
        runtime = time.time() - self._sitting_start if sitting_runtime is None else sitting_runtime
        return self._totals.plus(loss_sum, runtime)

    def _samples_per_step(self) -> int:
        """Examples per optimizer step over all processes, as `Trainer.train` counts them for its speeds."""
        return self.state.train_batch_size * self.args.gradient_accumulation_steps * self.args.world_size

    def held_out_loss(self) -> float:
        """Loss of the fixed reward batch in eval mode, in chunks of one training micro-batch (`HeldOutReward`)."""
        return self._held_out_reward.loss(self.model)

    # ----- checkpoints, resume and saving -----

    def _tying_state(self) -> dict:
        """What `tying_state.pt` holds (collective: every process calls it, see `TyingDecisions.state_dict`)."""
        return {
            "tying_strategy": self.args.tying_strategy,
            "settings": {
                **{name: getattr(self.args, name) for name in self.args.strategy_settings()},
                **self.args.distillation_settings(),
                **{name: getattr(self.args, name) for name in LOOP_SETTINGS},
            },
            "decisions": self.engine.state_dict(),
            "starting_model": starting_model(self.model),
            "training": dataclasses.asdict(self._training_totals()),
        }

    def _write_tying_state(self, folder: str, **recorded) -> None:
        state = self._tying_state()
        if self.args.should_save:
            write_tying_state(folder, {**state, **recorded})

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's checkpoint, then the tying state, written last and atomically (a checkpoint with a
        `tying_state.pt` is complete), then the history so far; only then are old checkpoints rotated out
        (`save_total_limit`), which the Trainer does at the end of its own part: a crash while this checkpoint is
        incomplete leaves the last complete one. A failed write names the folder and the disk's free space. With
        `push_to_hub`, the checkpoint is pushed once complete, which the Trainer would do before the tying state."""
        run_dir = trainer_output_dir(self, trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            # A run resumed from an earlier checkpoint saves again into a folder its first run left: that run's tying
            # state would make this one look complete while it is half written.
            Path(folder, TYING_STATE_NAME).unlink(missing_ok=True)
        with set_aside(self.args, save_total_limit=None, push_to_hub=False) as asked, explain_write_errors(folder):
            super()._save_checkpoint(model, trial)
        self._write_tying_state(folder, checkpoint_sha256=checkpoint_digest(folder) if self.args.should_save else None)
        self.history.flush(self.args.should_save)
        if asked["push_to_hub"]:
            self._push_from_checkpoint(folder)
        if self.args.should_save:
            rotate_checkpoints(run_dir, asked["save_total_limit"], self.state.best_model_checkpoint, use_mtime=True)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        state = read_tying_state(resume_from_checkpoint)
        check_checkpoint_readable(resume_from_checkpoint)
        check_tying_state_belongs(resume_from_checkpoint, state)
        check_resumes_saved_settings(self.args, resume_from_checkpoint, state)
        check_resumes_starting_model(resume_from_checkpoint, state, self.args.untie_init, self.model)
        self._totals = TrainingTotals.saved_in(state, checkpoint_step(resume_from_checkpoint) or 0)
        if isinstance(self.model, TiedBlocksMixin) and self.args.tying_mode != "none":
            self._retie_to_checkpoint(resume_from_checkpoint)
        if state is not None:
            self.engine.load_state_dict(state["decisions"])
            # The history on disk restarts from the checkpoint, as the run does.
            self.history.flush(self.args.should_save)
        # Relaxed ties (this run's, or those of a relaxed folder trained on as it is): a checkpoint saved after the map
        # was applied holds the tied base and its adapters; one saved before (similarity's warm-up) is a plain one,
        # and the adapters come when the run applies the map.
        relaxed = self.args.lora_rank is not None or carries_integrated_adapters(self.model)
        if relaxed and holds_adapters(resume_from_checkpoint):
            if not carries_integrated_adapters(self.model):
                self.engine.relax(self.args.lora_rank, "zero", None)  # into an optimizer passed in, too
            load_relaxed_weights(self.model, resume_from_checkpoint)
            return
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        """The best checkpoint's map and weights, after the last decision got its outcome from the weights it led
        to (the Trainer loads the best model before `train` returns)."""
        self._finish_decisions()
        best = self.state.best_model_checkpoint
        # The main process's answer on every process: the re-tie below is collective.
        if not (best and self.engine.processes.broadcast(os.path.isdir(best))):  # the Trainer keeps the last weights, with a warning
            super()._load_best_model()
            return
        self._best_step_loaded = self.state.best_global_step
        if self.args.tying_mode != "none":
            self._retie_to_checkpoint(best)
        if carries_integrated_adapters(self.model):  # relaxed ties, this run's or a relaxed folder's trained on
            load_relaxed_weights(self.model, best)  # a best checkpoint from before the map: its adapters at zero
            return
        super()._load_best_model()

    def _retie_to_checkpoint(self, checkpoint: str) -> None:
        """Re-tie the model to `checkpoint`'s map, bringing along an optimizer that exists already (one passed in
        `optimizers`, or the Trainer's when the best model is loaded at the end) and a DDP wrapper. Collective."""
        self.engine.retie_to(checkpoint_tying_map(checkpoint, len(self.model.tied_blocks)))

    def _finish_decisions(self) -> None:
        """Give the decision still pending its outcome, log it and write the history (`TyingEngine.finish_decisions`)."""
        self.engine.finish_decisions(self.args.should_save)

    def _issue_warnings_after_load(self, load_result) -> None:
        # Tied blocks are not stored in the checkpoint: they are restored by sharing, not missing.
        tied = declared_tied_weights(self.model)
        load_result.missing_keys[:] = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result)

    def save_state(self) -> None:
        """`Trainer.save_state`, written atomically: the final `trainer_state.json` is what tells a re-run that the
        run finished, so a kill while it is written leaves the old file or none, never half of one."""
        if not self.is_world_process_zero():  # as the Trainer's own
            return
        path = os.path.join(self.args.output_dir, TRAINER_STATE_NAME)
        with explain_write_errors(self.args.output_dir):
            self.state.save_to_json(path + ".partial")
            os.replace(path + ".partial", path)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model; a final save (not a checkpoint's) also writes its tying state, plot and model card beside
        it, and with `push_to_hub` pushes the folder once they are written (the Trainer would push before). Like
        transformers' own sharded saves, a final save is collective: call it on every process."""
        if _internal_call:  # a checkpoint's: `_save_checkpoint` explains its write errors
            super().save_model(output_dir, _internal_call)
            return
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        with set_aside(self.args, push_to_hub=False) as asked, explain_write_errors(output_dir):
            super().save_model(output_dir, _internal_call)
        self._write_tying_state(output_dir)
        if self.args.should_save and isinstance(self.model, TiedBlocksMixin):
            with explain_write_errors(output_dir):
                self._write_plot_and_card(Path(output_dir))
        if asked["push_to_hub"]:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def create_model_card(self, model_name: str | None = None, eval_results: dict | None = None, **kwargs) -> None:
        """Write the hf-layertie card (map, distinct blocks, parameters, results, plot, loading code) as README.md.

        Called by `Trainer.push_to_hub`; `eval_results` defaults to the last evaluation in the log history. The
        Trainer card's other arguments (`license`, `tags`, `dataset`, ...) have no place in it: a warning names those
        given (datasets and base model go in `model_card_kwargs`).
        """
        if not isinstance(self.model, TiedBlocksMixin):
            return super().create_model_card(model_name=model_name, **kwargs)
        unused = sorted(name for name, value in kwargs.items() if value)
        if unused:
            logger.warning(
                f"create_model_card: the hf-layertie card does not take {', '.join(unused)}; they are left out (pass "
                f"dataset_names and base_model in TyingTrainer(model_card_kwargs=...))"
            )
        if self.is_world_process_zero():
            self._write_plot_and_card(Path(self.args.output_dir), model_name=model_name, eval_results=eval_results)

    def _write_plot_and_card(self, output_dir: Path, model_name: str | None = None, eval_results: dict | None = None):
        plot = None
        if self._draws_plot and self.tying_records:
            plot = plot_tying_history(
                self.tying_records,
                output_dir / TYING_PLOT_NAME,
                final_step=self.state.global_step,
                saved_step=self._best_step_loaded,
                skipped=self._skipped_over_training(),
            )
        evaluated_only = self.state.global_step == 0  # a run that scored the model and trained nothing
        if evaluated_only and checkpoint_step(output_dir):  # a run that trained steps: its card names the training
            logger.warning(
                f"{output_dir} holds a trained run: its model card is kept, without this evaluation's results "
                "(an output_dir of its own gets a card of the evaluation)"
            )
            return
        write_model_card(
            self.model,
            output_dir,
            training_args=None if evaluated_only else self.args,
            evaluated_only=evaluated_only,
            eval_results=eval_results if eval_results is not None else self._last_eval_metrics(),
            tying_plot=plot,
            model_name=model_name or self.args.hub_model_id or output_dir.name,
            **self.model_card_kwargs,
        )

    def _last_eval_metrics(self) -> dict:
        """The loss of the model the card describes: the last evaluation's, or, with the best model loaded at the
        end, the evaluation that chose it (the last one scored the final step's weights, which were not saved)."""
        evaluations = [entry for entry in self.state.log_history if "eval_loss" in entry]
        best = self._best_step_loaded
        if best is not None:
            evaluations = [entry for entry in evaluations if entry["step"] <= best] or evaluations
        if not evaluations:
            return {}
        loss = evaluations[-1]["eval_loss"]
        return {"eval_loss": loss, "perplexity": perplexity(loss)}

