"""The workflow behind `run_lambada.py`: evaluate a causal checkpoint on LAMBADA, optionally after fine-tuning on it.

- `--do_eval` alone: the standard protocol over every passage of `--lambada_file`.
- `--do_train`: fine-tune on the passages before the fixed hold-out (`lambada_finetune_split`: the last
  `--eval_fraction` of the file), with the tying strategy of the training arguments; `--do_eval` then
  scores the held-out passages that share no run of 8 words with a trained one (passages of one novel overlap).

Metrics (`eval_lambada_accuracy`, `eval_lambada_perplexity`, ...) go through the Trainer's metrics
(`log_metrics`, `eval_results.json`) and into the model card.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, set_seed

from ..data import LAMBADA_TEST_FILE
from ..toolkit import (
    ModelArguments,
    changed_from_default,
    check_training_sources,
    fit_tokenizer_to_model,
    load_model,
    load_tokenizer,
    parse_command_line,
    process_group_ended,
    refuse_training_settings_without_training,
    resolve_block_size,
    set_up_logging,
    split_reward_examples,
    tied_model_type,
    tied_model_types,
)
from ..trainer import TrainingStart, TyingTrainer, TyingTrainingArguments, save_training_outputs, training_start
from .evaluation import evaluate_lambada
from .finetune import lambada_causal_lm_dataset, lambada_finetune_split
from .reader import read_lambada_jsonl


@dataclass
class LambadaArguments:
    """The LAMBADA data and how it is split and scored."""

    lambada_file: str = field(
        default=str(LAMBADA_TEST_FILE),
        metadata={"help": "OpenAI-format LAMBADA JSON lines (one {\"text\": ...} per line). Default: the shipped test set."},
    )
    eval_fraction: float = field(
        default=0.1, metadata={"help": "With --do_train: the last share of the file held out for evaluation."}
    )
    block_size: int | None = field(default=None, metadata={"help": "Fine-tuning: tokens kept per passage (from the end)."})
    max_eval_passages: int | None = field(default=None, metadata={"help": "Score only the first N evaluation passages."})

    def __post_init__(self):
        for name in ("block_size", "max_eval_passages"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"--{name} must be a positive integer, got {value!r}")
        if not 0 < self.eval_fraction < 1:
            raise ValueError(f"--eval_fraction must be strictly between 0 and 1, got {self.eval_fraction}")


def run_lambada(argv: list[str] | None = None) -> dict[str, float]:
    """Evaluate and/or fine-tune; returns the metrics (also written to `output_dir/eval_results.json`)."""
    with process_group_ended():
        return _evaluate_and_fine_tune(
            *parse_command_line((ModelArguments, LambadaArguments, TyingTrainingArguments), argv)
        )


def _evaluate_and_fine_tune(
    model_args: ModelArguments, lambada_args: LambadaArguments, training_args: TyingTrainingArguments
) -> dict[str, float]:
    if model_args.model_name_or_path is None:
        raise ValueError("--model_name_or_path is required: the causal checkpoint to evaluate or fine-tune")
    if not (training_args.do_train or training_args.do_eval):
        raise ValueError("Nothing to do: pass --do_eval, --do_train or both")
    _refuse_unread(lambada_args, training_args)
    if training_args.eval_strategy != "no":
        raise ValueError(
            f"--eval_strategy {training_args.eval_strategy.value}: run_lambada scores the held-out passages once, after "
            f"fine-tuning (--do_eval), by the LAMBADA protocol, and holds no evaluation set to score during it; leave "
            f"--eval_strategy at 'no'"
        )
    refuse_training_settings_without_training(training_args)
    check_training_sources(training_args)
    set_up_logging(training_args.get_process_log_level())
    # Before any model or data is loaded: a finished run is not trained again, a run this command may not continue
    # is refused.
    start = TrainingStart()
    if training_args.do_train:
        start = training_start(training_args, lambda saved: _asked_of_finished_run(training_args))
        if start.saved_metrics is not None:
            return start.saved_metrics
    set_seed(training_args.seed)

    passages = read_lambada_jsonl(lambada_args.lambada_file)
    hub_options = model_args.hub_options
    flag = "--tokenizer_name" if model_args.tokenizer_name else "--model_name_or_path"
    tokenizer = load_tokenizer(model_args.tokenizer_name or model_args.model_name_or_path, flag=flag, **hub_options)
    model_type = tied_model_type(model_args.model_name_or_path, model_args.model_type, **hub_options)
    if model_type not in tied_model_types(AutoModelForCausalLM):
        raise ValueError(f"--model_name_or_path {model_args.model_name_or_path}: LAMBADA needs a causal model, got {model_type!r}")
    model = load_model(
        model_type, tokenizer, model_args.model_name_or_path, looped_config=model_args.looped_config, **model_args.loading_options, **hub_options
    )
    card = {"dataset_names": ["lambada"], "base_model": model_args.model_name_or_path}

    if training_args.do_train:
        train_passages, eval_passages = lambada_finetune_split(passages, lambada_args.eval_fraction)
        trainer = _fine_tune(model, tokenizer, train_passages, lambada_args, training_args, card, start.resume)
    else:
        eval_passages = passages
        # Evaluation only: no tying decision runs, the checkpoint's own map is scored as it is.
        trainer = TyingTrainer(
            model=model,
            args=training_args.without_tying(),
            processing_class=tokenizer,
            model_card_kwargs=card,
        )

    metrics: dict[str, float] = {}
    if training_args.do_eval:
        if lambada_args.max_eval_passages is not None:
            eval_passages = eval_passages[: lambada_args.max_eval_passages]
        scores = evaluate_lambada(
            trainer.model,
            tokenizer,
            eval_passages,
            batch_size=training_args.per_device_eval_batch_size,
            device=training_args.device,
            show_progress=not training_args.disable_tqdm,
        )
        metrics = {f"eval_{key}": value for key, value in scores.items()}
        trainer.log(metrics)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        trainer.create_model_card(eval_results={"lambada": scores})
    if training_args.push_to_hub:  # the model and the card with the scores (`push_to_hub` writes the card again)
        trainer.push_to_hub(**({"eval_results": {"lambada": scores}} if training_args.do_eval else {}))
    return metrics


# The LAMBADA settings only fine-tuning or only evaluation reads.
_READ_ONLY_BY = {"do_train": ("eval_fraction", "block_size"), "do_eval": ("max_eval_passages",)}


def _refuse_unread(lambada_args: LambadaArguments, training_args: TyingTrainingArguments) -> None:
    """Refuse a LAMBADA setting given away from its default where this run does not do what reads it."""
    for stage, names in _READ_ONLY_BY.items():
        given = changed_from_default(lambada_args, names)
        if given and not getattr(training_args, stage):
            raise ValueError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} read only with --{stage}, which this run does not pass")


def _fine_tune(model, tokenizer, passages, lambada_args, training_args, card, resume: str | None) -> TyingTrainer:
    if tokenizer.pad_token is None:  # GPT-2 has none; padding positions are masked out of the loss
        tokenizer.pad_token = tokenizer.eos_token
    block_size = resolve_block_size(lambada_args.block_size, model.config.max_position_embeddings)
    train_dataset, reward_dataset = lambada_causal_lm_dataset(passages, tokenizer, block_size), None
    fit_tokenizer_to_model(tokenizer, model)
    if training_args.reward_source == "held_out":
        train_dataset, reward_dataset = split_reward_examples(train_dataset, training_args.reward_batch_size)
    trainer = TyingTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        reward_dataset=reward_dataset,
        processing_class=tokenizer,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        model_card_kwargs=card,
    )
    save_training_outputs(trainer, trainer.train(resume_from_checkpoint=resume).metrics)
    return trainer


def _asked_of_finished_run(training_args: TyingTrainingArguments) -> list[str]:
    """What this command asks of a finished fine-tuning run beyond its saved results: an evaluation (the saved one
    records no passages or file, so it is scored again), a push to the Hub."""
    asked = ["an evaluation (--do_eval)"] if training_args.do_eval else []
    return asked + (["a push to the Hub (--push_to_hub)"] if training_args.push_to_hub else [])
