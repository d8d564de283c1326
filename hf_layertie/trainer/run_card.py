"""The model card and tying plot a `TyingTrainer` writes beside its final model (and `create_model_card` for a push).

The card describes the model saved: with the best model loaded at the end, that checkpoint's step (marked on the
plot) and the evaluation that chose it, not the last one (which scored the final step's weights, never saved).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

from transformers import PreTrainedModel, TrainerState

from ..checks import perplexity
from ..model_card import build_model_card, write_model_card
from .checkpoint_format import checkpoint_step
from .loop_schedule import skipped_over_training
from .training_args import TyingTrainingArguments
from .tying_plot import TYING_PLOT_NAME, plot_tying_history, require_matplotlib

logger = logging.getLogger(__name__)

# What `write_model_card` takes that the trainer fills in itself; `model_card_kwargs` may set the rest.
_CARD_KWARGS_FILLED = frozenset({"model", "training_args", "eval_results", "tying_plot", "model_name", "evaluated_only"})


class RunCard:
    """What a run's card says beyond the model: the user's `model_card_kwargs` (checked at once: the card is written
    when training ends), whether a plot is drawn, and the step of the best model loaded at the end, if any.

    Args:
        model_card_kwargs: keyword arguments of `hf_layertie.model_card.build_model_card` the trainer does not fill.
        plots: whether the run draws `tying_map.png` (a strategy that ties, `tying_plot`, matplotlib installed).
    """

    def __init__(self, model_card_kwargs: dict | None, plots: bool):
        self.kwargs = checked_card_kwargs(model_card_kwargs)
        self.plots = plots and matplotlib_installed()
        self.best_step_loaded: int | None = None  # the best checkpoint's step, once its model is loaded at the end

    def write(
        self,
        output_dir: Path,
        model: PreTrainedModel,
        args: TyingTrainingArguments,
        state: TrainerState,
        tying_records: list[dict],
        model_name: str | None = None,
        eval_results: dict | None = None,
    ) -> None:
        """Draw the plot (with decisions to show) and write README.md into `output_dir`; an evaluation alone into a
        trained run's folder keeps that run's card."""
        plot = None
        if self.plots and tying_records:
            fixed = None if args.loop_onset is not None else model.config.skipped_positions
            skipped = skipped_over_training(tying_records, state.global_step, state.max_steps, args.loop_onset, args.loop_schedule, fixed)
            plot = plot_tying_history(
                tying_records, output_dir / TYING_PLOT_NAME, final_step=state.global_step, saved_step=self.best_step_loaded, skipped=skipped
            )
        evaluated_only = state.global_step == 0  # a run that scored the model and trained nothing
        if evaluated_only and checkpoint_step(output_dir):  # a run that trained steps: its card names the training
            logger.warning(
                f"{output_dir} holds a trained run: its model card is kept, without this evaluation's results "
                "(an output_dir of its own gets a card of the evaluation)"
            )
            return
        write_model_card(
            model,
            output_dir,
            training_args=None if evaluated_only else args,
            evaluated_only=evaluated_only,
            eval_results=eval_results if eval_results is not None else self.last_eval_metrics(state.log_history),
            tying_plot=plot,
            model_name=model_name or args.hub_model_id or output_dir.name,
            **self.kwargs,
        )

    def last_eval_metrics(self, log_history: list[dict]) -> dict:
        """The loss of the model the card describes: the last evaluation's, or, with the best model loaded at the
        end, the evaluation that chose it (the last one scored the final step's weights, which were not saved)."""
        evaluations = [entry for entry in log_history if "eval_loss" in entry]
        if self.best_step_loaded is not None:
            evaluations = [entry for entry in evaluations if entry["step"] <= self.best_step_loaded] or evaluations
        if not evaluations:
            return {}
        loss = evaluations[-1]["eval_loss"]
        return {"eval_loss": loss, "perplexity": perplexity(loss)}


def warn_unused_card_arguments(trainer_card_arguments: dict) -> None:
    """Name the Trainer card's arguments given to `create_model_card` (`license`, `tags`, `dataset`, ...), which
    the hf-layertie card has no place for."""
    unused = sorted(name for name, value in trainer_card_arguments.items() if value)
    if unused:
        logger.warning(
            f"create_model_card: the hf-layertie card does not take {', '.join(unused)}; they are left out (pass "
            f"dataset_names and base_model in TyingTrainer(model_card_kwargs=...))"
        )


def checked_card_kwargs(model_card_kwargs: dict | None) -> dict:
    """`model_card_kwargs`, refused at once if the card cannot take them (the card is written when training ends)."""
    model_card_kwargs = dict(model_card_kwargs or {})
    settable = [name for name in inspect.signature(build_model_card).parameters if name not in _CARD_KWARGS_FILLED]
    unknown = sorted(set(model_card_kwargs) - set(settable))
    if unknown:
        raise ValueError(f"model_card_kwargs: {', '.join(unknown)} cannot be set; the card takes {', '.join(settable)} (the trainer fills in the rest)")
    return model_card_kwargs


def matplotlib_installed() -> bool:
    """Whether matplotlib (an optional extra) can draw the tying plot; without it saves draw none, as said here once."""
    try:
        require_matplotlib()
    except ImportError:
        logger.warning(f"matplotlib is not installed: {TYING_PLOT_NAME} is not drawn (pip install 'hf-layertie[plot]')")
        return False
    return True
