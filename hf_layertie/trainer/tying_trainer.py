"""`TyingTrainer`: transformers' Trainer with a tying strategy inside `training_step`.

The trainer is glue. The strategy (`hf_layertie.decisions`) decides and the tying engine (`hf_layertie.engine`) takes
its decisions, once per optimizer step where one is due, on every process; the trainer hands the engine the
Trainer's optimizer, DDP wrapper, accelerator and held-out reward batch. A run's life over its sittings (resume, a
finished run finished from, the whole run's totals) is `run_lifecycle`'s, what a checkpoint holds
`checkpoint_format`'s, the refusals `guards`', the card and plot `run_card`'s and distillation `distillation`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import torch
from transformers import Trainer, TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints

from ..decisions import TyingDecisions
from ..engine import TyingEngine, TyingHistory
from ..engine.block_learning_rates import split_by_block_uses
from ..engine.optimizer_sync import check_data_parallel_can_rebuild, rebuild_data_parallel
from ..engine.processes import AcceleratorProcesses
from ..models._compat import (
    carries_integrated_adapters,
    check_trainer_private_api,
    declared_tied_weights,
    prepare_inputs,
    trainer_output_dir,
)
from ..models.tied_blocks import TiedBlocksMixin
from ..relaxed_ties import check_lora_rank, load_relaxed_weights
from .checkpoint_format import (
    TYING_STATE_NAME,
    checkpoint_digest,
    checkpoint_step,
    checkpoint_tying_map,
    explain_write_errors,
    save_trainer_state,
    tying_state_of,
    write_tying_state,
)
from .compilation import compile_regionally
from .distillation import start_distillation
from .guards import (
    check_model_can_tie,
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
from .held_out_reward import HeldOutReward
from .loop_schedule import skipped_positions_at
from .non_finite_loss import NonFiniteLossGuard
from .run_card import RunCard, warn_unused_card_arguments
from .run_lifecycle import RunTotals, TrainingTotals, read_resumable_tying_state, resume_argument
from .training_args import TyingTrainingArguments

logger = logging.getLogger(__name__)
# The private Trainer methods below override or call (`_compat.TRAINER_PRIVATE_API`): a rename fails here, by name.
check_trainer_private_api(Trainer)

__all__ = ["TyingTrainer"]


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
            `decisions`, `history`, `tying_records` and `tying_seconds` (this sitting's only) are its own.
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
        self._non_finite_loss = NonFiniteLossGuard()
        self._run_checked = False
        self._totals = RunTotals(lambda value: self.engine.processes.mean(value))  # the whole run's, over sittings
        decisions_class = args.decisions_class
        if decisions_class.needs_tied_model:
            check_model_can_tie(self.model, args.tying_strategy)
        self._card = RunCard(model_card_kwargs, args.tying_plot and decisions_class.needs_tied_model)
        refuse_trainer_settings_that_cannot_follow_reties(args)
        decisions = args.tying_decisions(len(self.model.tied_blocks) if isinstance(self.model, TiedBlocksMixin) else 0)
        if decisions.lora_rank is not None:  # static and similarity: before the map is applied (similarity's after a warm-up)
            check_lora_rank(self.model, decisions.lora_rank, decisions.num_distinct)
        held_out = args.reward_source == "held_out"
        self._held_out_reward = HeldOutReward.of_trainer(self, reward_dataset) if held_out else None
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
        if self.distillation is not None:  # the Trainer counts the scored tokens and scales the mix as its own loss
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
        self._totals.add_loss(loss)
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

    def _get_grad_norm(self, model, grad_norm=None):
        """The Trainer's gradient norm, measured before `optimizer.step()`: the step's losses and this norm are
        checked there (`NonFiniteLossGuard.check`), so no update, checkpoint or model is made of NaN weights."""
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        self._non_finite_loss.check(grad_norm, self.accelerator, self.state.global_step, self.args.output_dir, self.args.learning_rate)
        return grad_norm

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs) -> TrainOutput:
        """`Trainer.train`, then the strategy's last reward (the loss of the steps after the last decision).

        The training metrics (`train_loss`, `train_runtime`, speeds) are the whole run's over every sitting, as is
        the Trainer's closing log entry (`run_lifecycle.RunTotals`). A checkpoint, or a finished run's folder, that
        reached the run's end is not trained further: the run is finished from it, with the metrics it had.
        `resume_from_checkpoint=True` resumes from the last complete checkpoint in `output_dir`.
        """
        resume_from_checkpoint, finished = resume_argument(resume_from_checkpoint, self.args)
        self._totals.restart()  # resuming loads the checkpoint's; a sitting an earlier call left (it raised) is not one
        if finished:
            metrics = self._finish_from(resume_from_checkpoint)
        else:
            self._totals.start_sitting()
            # The Trainer's closing log entry ended the sitting (`log`): `_totals.saved` are the run's.
            metrics = super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs).metrics
            self.engine.finish_decisions(self.args.should_save)
        metrics.update(self._totals.saved.metrics(self.state.global_step, self._samples_per_step(), self.state.total_flos))
        if self.distillation is not None:
            metrics["teacher_parameters_mib"] = self.distillation.parameters_mib
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """`Trainer.log`; the closing entry of a sitting (`train_runtime`, `train_loss`, speeds), which `Trainer.train`
        computes over this sitting's steps only, carries the whole run's instead: the console, the trackers and
        `trainer_state.json` show the numbers `train` returns. Collective, as the closing entry is logged by all."""
        if "train_runtime" not in logs or not self._totals.in_sitting:
            super().log(logs, start_time)
            return
        totals = self._totals.end_sitting(logs["train_runtime"])  # `train` then finds the totals closed
        whole_run = {**logs, **totals.metrics(self.state.global_step, self._samples_per_step(), self.state.total_flos)}
        super().log(whole_run, start_time)
        # What `Trainer.log` adds (`epoch`, tokens seen) reaches the metrics `train` returns, as without the override;
        # the sitting's own numbers stay in them (`train` adds the run's from them).
        logs.update({key: value for key, value in whole_run.items() if key not in logs})

    def _finish_from(self, checkpoint: str) -> dict[str, float]:
        logger.warning(f"{checkpoint} is at max_steps={self.args.max_steps} already: finishing the run from it, training no step")
        self._load_from_checkpoint(checkpoint)
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
        self.engine.finish_decisions(self.args.should_save)
        # From the last checkpoint, as the run would have ended uninterrupted; a finished run's output folder holds
        # the best model already. A best checkpoint gone since is left, as the Trainer leaves it (with a warning).
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and Path(checkpoint).name.startswith(PREFIX_CHECKPOINT_DIR):
            if os.path.isdir(best):
                self._load_best_model()
            else:
                logger.warning(f"Could not find the best model at {best}: the run ends on {checkpoint}'s model")
        elif self.args.load_best_model_at_end and best is not None:  # the folder's model: the best, as its run ended
            self._card.best_step_loaded = self.state.best_global_step
        return {"epoch": self.state.epoch}

    def _samples_per_step(self) -> int:
        """Examples per optimizer step over all processes, as `Trainer.train` counts them for its speeds."""
        return self.state.train_batch_size * self.args.gradient_accumulation_steps * self.args.world_size

    def held_out_loss(self) -> float:
        """Loss of the fixed reward batch in eval mode, in chunks of one training micro-batch (`HeldOutReward`)."""
        return self._held_out_reward.loss(self.model)

    # ----- checkpoints, resume and saving -----

    def _write_tying_state(self, folder: str, **recorded) -> None:
        """`tying_state.pt` (collective: every process builds it, see `TyingDecisions.state_dict`)."""
        state = tying_state_of(self.args, self.engine.state_dict(), self.model, dataclasses.asdict(self._totals.now()))
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
        state = read_resumable_tying_state(resume_from_checkpoint, self.args, self.model)
        self._totals.saved = TrainingTotals.saved_in(state, checkpoint_step(resume_from_checkpoint) or 0)
        if isinstance(self.model, TiedBlocksMixin) and self.args.tying_mode != "none":
            self.engine.retie_to(checkpoint_tying_map(resume_from_checkpoint, len(self.model.tied_blocks)))
        if state is not None:
            self.engine.load_state_dict(state["decisions"])
            # The history on disk restarts from the checkpoint, as the run does.
            self.history.flush(self.args.should_save)
        if not self.engine.load_relaxed_checkpoint(resume_from_checkpoint, self.decisions.lora_rank):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_best_model(self) -> None:
        """The best checkpoint's map and weights, after the last decision got its outcome from the weights it led
        to (the Trainer loads the best model before `train` returns)."""
        self.engine.finish_decisions(self.args.should_save)
        best = self.state.best_model_checkpoint
        # The main process's answer on every process: the re-tie below is collective.
        if not (best and self.engine.processes.broadcast(os.path.isdir(best))):  # the Trainer keeps the last weights, with a warning
            super()._load_best_model()
            return
        self._card.best_step_loaded = self.state.best_global_step
        if self.args.tying_mode != "none":
            self.engine.retie_to(checkpoint_tying_map(best, len(self.model.tied_blocks)))
        if carries_integrated_adapters(self.model):  # relaxed ties, this run's or a relaxed folder's trained on
            load_relaxed_weights(self.model, best)  # a best checkpoint from before the map: its adapters at zero
            return
        super()._load_best_model()

    def _issue_warnings_after_load(self, load_result) -> None:
        # Tied blocks are not stored in the checkpoint: they are restored by sharing, not missing.
        tied = declared_tied_weights(self.model)
        load_result.missing_keys[:] = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result)

    def save_state(self) -> None:
        """`Trainer.save_state`, written atomically (`save_trainer_state`)."""
        if self.is_world_process_zero():  # as the Trainer's own
            save_trainer_state(self.state, self.args.output_dir)

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
                self._card.write(Path(output_dir), self.model, self.args, self.state, self.tying_records)
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
        warn_unused_card_arguments(kwargs)
        if self.is_world_process_zero():
            self._card.write(Path(self.args.output_dir), self.model, self.args, self.state, self.tying_records, model_name, eval_results)
