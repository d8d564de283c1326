"""The workflow behind `run_clm.py` and `run_mlm.py`: one code path, two tasks.

Parse arguments (the embedded default when no data or model is named) -> load and check data -> tokenizer and
tied model -> TyingTrainer -> train (resuming from the last complete checkpoint in `output_dir`) -> evaluate
(perplexity = exp(eval loss), beside a count baseline of the same tokenization) -> save the model, its card and
the tying plot (and push them if asked) -> print a sample.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    DataCollatorForLanguageModeling,
    PreTrainedModel,
    default_data_collator,
    pipeline,
    set_seed,
)

from ..checks import perplexity
from ..serving import check_servable_model, looped_layout, save_for_serving
from ..toolkit import (
    ModelArguments,
    bigram_loss,
    check_training_sources,
    fit_tokenizer_to_model,
    has_own_validation_split,
    load_model,
    load_text_datasets,
    load_tokenizer,
    mask_evaluation_blocks,
    parse_command_line,
    process_group_ended,
    read_stream,
    refuse_training_settings_without_training,
    resolve_block_size,
    set_up_logging,
    split_reward_examples,
    take_first,
    text_column,
    tied_model_type,
    tied_model_types,
    tokenize_and_group,
    unigram_loss,
)
from ..trainer import TrainingStart, TyingTrainer, TyingTrainingArguments, save_training_outputs, training_start
from .arguments import DataTrainingArguments
from .generated_tasks import (
    HOP_TASKS,
    evaluate_hop_task,
    hop_task_label,
    hop_task_metrics,
    hop_task_tokenizer,
    load_hop_task,
    print_hop_task_report,
)

logger = logging.getLogger(__name__)

DEFAULTS_DIR = Path(__file__).resolve().parent / "defaults"
SAMPLE_SEED = 0


@dataclass(frozen=True)
class LanguageModelingTask:
    """What differs between causal and masked language modeling; everything else is shared."""

    name: str
    model_types: tuple[str, ...]  # the first is the default
    tokenizer: str
    masked: bool

    @property
    def default_arguments(self) -> Path:
        return DEFAULTS_DIR / f"{self.name}_default.json"

    @property
    def description(self) -> str:
        model = {"clm": "a tied causal language model (GPT-2, Llama, Qwen2, Mistral)", "mlm": "a tied BERT"}[self.name]
        return (
            f"Train and/or evaluate {model} with a tying strategy (see the tying arguments below).\n\n"
            f"With no data or model arguments (--dataset_name, --train_file, --validation_file, --model_name_or_path, "
            f"--model_type), the embedded default applies ({self.default_arguments.name}: a small model on the shipped "
            f"Shakespeare plays, offline) and every flag given overrides it, e.g. `--max_steps 50 --output_dir x`. "
            f"A run must train (--do_train), evaluate (--do_eval) or both. Arguments may also come from one .json or "
            f".yaml file."
        )


CAUSAL_LM = LanguageModelingTask("clm", tied_model_types(AutoModelForCausalLM), "shakespeare-bpe", False)
MASKED_LM = LanguageModelingTask("mlm", tied_model_types(AutoModelForMaskedLM), "shakespeare-wordpiece", True)
# The data settings and seeds of the evaluation saved in a run's folder (`_evaluation_settings`).
EVALUATION_SETTINGS_FILE = "eval_settings.json"
ArgumentTuple = tuple[ModelArguments, DataTrainingArguments, TyingTrainingArguments]


def parse_arguments(task: LanguageModelingTask, argv: list[str] | None = None) -> ArgumentTuple:
    """Flags, or one .json / .yaml file of them; without data or model arguments, on top of the embedded default."""
    arguments = parse_command_line(
        (ModelArguments, DataTrainingArguments, TyingTrainingArguments),
        argv,
        default_file=task.default_arguments,
        description=task.description,
    )
    model_args, data_args, training_args = arguments
    if not task.masked and data_args.mlm_probability is not None:
        raise ValueError(
            f"--mlm_probability {data_args.mlm_probability}: run_{task.name}.py predicts each next token and masks "
            "nothing; the share of masked tokens is run_mlm.py's setting"
        )
    if not (training_args.do_train or training_args.do_eval):
        raise ValueError("Nothing to do: pass --do_train, --do_eval or both (see --help)")
    _refuse_serving_into_output_dir(data_args.serving_output_dir, training_args.output_dir)
    if not training_args.do_train and model_args.model_name_or_path is None:
        raise ValueError(
            "--do_eval without --do_train scores the model of --model_name_or_path, and none was given (a model built "
            f"from scratch has learned nothing): pass --model_name_or_path, e.g. {training_args.output_dir} for the "
            "model trained there"
        )
    refuse_training_settings_without_training(training_args)
    check_training_sources(training_args)
    if data_args.dataset_name in HOP_TASKS and model_args.tokenizer_name is not None:
        raise ValueError(
            f"--dataset_name {data_args.dataset_name} generates its examples with its own word-level tokenizer: it reads "
            f"no --tokenizer_name ({model_args.tokenizer_name}); leave it unset"
        )
    if training_args.do_train and data_args.validation_file is not None and data_args.train_file is None:
        raise ValueError(
            "--validation_file needs --train_file to train on: to evaluate the file alone, pass --do_eval without "
            "--do_train"
        )
    if data_args.streaming:
        check_streaming_arguments(model_args, data_args, training_args)
    return arguments


def check_streaming_arguments(
    model_args: ModelArguments, data_args: DataTrainingArguments, training_args: TyingTrainingArguments
) -> None:
    """A stream has no length: training needs a number of steps, and evaluation a number of blocks to read; rows
    held out by their index need one reader."""
    if training_args.do_train and training_args.max_steps <= 0:
        raise ValueError(
            "--streaming needs --max_steps to train: a stream has no length, so the Trainer cannot tell how many "
            "steps --num_train_epochs makes. Pass --max_steps N (or drop --streaming)"
        )
    workers = training_args.dataloader_num_workers
    if training_args.do_train and workers > 1 and _holds_out_by_index(data_args, training_args, model_args.cache_dir):
        raise ValueError(
            f"--streaming with --dataloader_num_workers {workers}: each worker reads its own shards of the stream and "
            "counts its rows from 0, so the rows held out by their index (for validation, where the source has no "
            "validation split of its own or its split names could not be read, and a held-out reward's blocks) would "
            "not be those training skips, and would be trained on. Pass --dataloader_num_workers 0 or 1, or a "
            "--validation_file (or a dataset with a validation split) with a reward from the training loss"
        )
    if training_args.do_eval and data_args.max_eval_samples is None:
        raise ValueError(
            "--streaming needs --max_eval_samples to evaluate: that many blocks of the validation stream are read "
            "into memory and evaluated (a stream's end is unknown). Pass --max_eval_samples N, or evaluate nothing "
            "(--do_eval false, and --eval_strategy no where the run's default evaluates during training)"
        )


def _holds_out_by_index(data_args: DataTrainingArguments, training_args: TyingTrainingArguments, cache_dir: str | None) -> bool:
    """Whether a streamed run holds rows of its training stream out by their index: a held-out reward's blocks, and
    the validation rows of a source without a validation split (the embedded corpus has one)."""
    if training_args.reward_source == "held_out":
        return True
    if data_args.dataset_name is not None:
        return not has_own_validation_split(data_args.dataset_name, data_args.dataset_config_name, cache_dir)
    return data_args.train_file is not None and data_args.validation_file is None


def run(task: LanguageModelingTask, argv: list[str] | None = None) -> dict[str, float]:
    """Train and/or evaluate; returns the metrics, also written as transformers' examples write them:
    `train_results.json`, `eval_results.json`, and both merged into `all_results.json` (an evaluation of a trained
    folder into that folder keeps its training metrics there)."""
    with process_group_ended():
        return _train_and_evaluate(task, *parse_arguments(task, argv))


def _train_and_evaluate(
    task: LanguageModelingTask,
    model_args: ModelArguments,
    data_args: DataTrainingArguments,
    training_args: TyingTrainingArguments,
) -> dict[str, float]:
    set_up_logging(training_args.get_process_log_level())
    output_dir = training_args.output_dir
    # Before any data or model is loaded: a finished run is not trained again, a run this command may not continue
    # is refused.
    start = TrainingStart()
    if training_args.do_train:
        start = training_start(training_args, lambda saved: _asked_beyond_saved(training_args, data_args, saved, output_dir))
        if start.saved_metrics is not None:
            return start.saved_metrics
    set_seed(training_args.seed)

    hop_task = data_args.dataset_name if data_args.dataset_name in HOP_TASKS else None
    if hop_task:
        if task.masked:
            raise ValueError(f"--dataset_name {hop_task} is a causal language modeling task: train it with run_clm.py")
        tokenizer = hop_task_tokenizer(hop_task, data_args.dataset_config_name)
        model = _load_model(task, model_args, tokenizer)
        seed = training_args.seed if training_args.data_seed is None else training_args.data_seed
        grouped = load_hop_task(hop_task, data_args.dataset_config_name, model.config.max_position_embeddings, seed)
    else:
        grouped, tokenizer, model = _text_data_and_model(task, model_args, data_args)
    fit_tokenizer_to_model(tokenizer, model)
    train_dataset = reward_dataset = None
    if training_args.do_train:
        if "train" not in grouped:  # a dataset with a validation split alone (files: refused above)
            raise ValueError(
                f"--dataset_name {data_args.dataset_name} has no 'train' split to train on: to evaluate it alone, pass "
                f"--do_eval without --do_train"
            )
        train_dataset, reward_dataset = _training_blocks(grouped["train"], data_args, training_args)
    if data_args.streaming:  # the blocks evaluated (or, training alone, the sample's prompt) are read into memory
        eval_dataset = read_stream(grouped["validation"], data_args.max_eval_samples if training_args.do_eval else 1)
    else:
        eval_dataset = take_first(grouped["validation"], data_args.max_eval_samples)
    # The blocks as read (the sample's prompt, the baseline's tokens); a masked LM scores them masked once.
    eval_blocks = eval_dataset
    if task.masked and training_args.do_eval:
        eval_dataset = mask_evaluation_blocks(eval_blocks, tokenizer, data_args.masked_share, training_args.seed)
    # A masked LM's held-out reward scores the same tokens at every decision, as many in each block: a token mean.
    if task.masked and reward_dataset is not None:
        reward_dataset = mask_evaluation_blocks(
            reward_dataset, tokenizer, data_args.masked_share, training_args.agent_seed, "held-out reward's blocks"
        )
    trainer = TyingTrainer(
        model=model,
        # Evaluation alone scores the model as it was saved: no strategy re-ties it.
        args=training_args if training_args.do_train else training_args.without_tying(),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        reward_dataset=reward_dataset,
        processing_class=tokenizer,
        data_collator=_collator(task, tokenizer, data_args.masked_share),
        model_card_kwargs={"dataset_names": [_dataset_label(data_args)], "base_model": model_args.model_name_or_path},
    )

    if data_args.serving_output_dir is not None:
        _check_servable(trainer, data_args.serving_output_dir)
    metrics: dict[str, float] = {}
    if training_args.do_train:
        train_metrics = dict(trainer.train(resume_from_checkpoint=start.resume).metrics)
        if start.resume != str(output_dir):  # trained (not finished from its own folder): its saved evaluation is stale
            _drop_saved_evaluation(trainer, output_dir)
        if not data_args.streaming:  # a stream's length is unknown
            train_metrics["train_samples"] = len(train_dataset)
        save_training_outputs(trainer, train_metrics)
        metrics.update(train_metrics)
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(eval_dataset)
        eval_metrics["perplexity"] = perplexity(eval_metrics["eval_loss"])
        if hop_task:
            scores = evaluate_hop_task(trainer.model, eval_dataset, training_args.per_device_eval_batch_size)
            eval_metrics.update(hop_task_metrics(scores))
        elif not data_args.streaming and trainer.is_world_process_zero():
            # Counted by the process that reports it (save_metrics, the card, the printout): every process would hold
            # the whole training split's tokens again. A stream does not hold a training split to count.
            counted = train_dataset
            if counted is None and "train" in grouped:  # evaluation alone: the blocks this command would train on
                counted = _training_blocks(grouped["train"], data_args, training_args)[0]
            eval_metrics.update(_baseline(task, tokenizer, counted, eval_dataset))  # a masked LM: the tokens it scored
        trainer.log_metrics("eval", eval_metrics)
        _drop_saved_evaluation(trainer, output_dir)  # merged in, keys an earlier evaluation had would stay
        trainer.save_metrics("eval", eval_metrics)
        if trainer.is_world_process_zero():
            settings = json.dumps(_evaluation_settings(data_args, training_args), indent=4, sort_keys=True)
            (Path(output_dir) / EVALUATION_SETTINGS_FILE).write_text(settings)
        metrics.update(eval_metrics)
    if data_args.serving_output_dir is not None and trainer.is_world_process_zero():
        try:
            layout = save_for_serving(trainer.model, data_args.serving_output_dir, tokenizer)
        except ValueError as error:  # a map a strategy chose: the trained model is saved in output_dir all the same
            raise ValueError(f"--serving_output_dir {data_args.serving_output_dir}: {error} (the trained model is in {output_dir})") from None
        logger.warning(f"Wrote {data_args.serving_output_dir} for serving: {layout.blocks} blocks stored, run {layout.loops} times")
    trainer.create_model_card()  # the card takes eval_loss and perplexity from the last evaluation
    if training_args.push_to_hub:
        trainer.push_to_hub()
    if trainer.is_world_process_zero():
        if hop_task:
            print_hop_task_report(metrics, hop_task)
        else:
            _print_report(task, metrics, trainer.model, tokenizer, eval_blocks, data_args.sample_max_new_tokens)
    return metrics


def _refuse_serving_into_output_dir(serving_output_dir: str | None, output_dir: str) -> None:
    """The serving export's config (`model_type: nanbeige`) would replace the tied run's, which then no longer loads
    nor resumes: it needs a folder of its own, neither the output folder nor inside it, nor around it."""
    if serving_output_dir is None:
        return
    serving, output = Path(serving_output_dir).resolve(), Path(output_dir).resolve()
    if serving == output or output in serving.parents or serving in output.parents:
        raise ValueError(
            f"--serving_output_dir {serving_output_dir} overlaps --output_dir {output_dir}: the serving export's "
            f"config.json would replace the tied model's, which then no longer loads. Pass a folder of its own"
        )


def _check_servable(trainer: TyingTrainer, folder: str) -> None:
    """Refuse `--serving_output_dir` before training where the trained model could not be served in the looped
    format: what training does not change (class, window, loop recipe, adapters, `--lora_rank`'s to come) always, the
    map where the strategy keeps it fixed (one that changes it is checked on the trained model)."""
    try:
        if trainer.args.lora_rank is not None:
            raise ValueError(f"lora_rank={trainer.args.lora_rank} relaxes the ties with per-position adapters, which make each loop differ: the looped format cannot express them")
        (check_servable_model if trainer.args.decisions_class.changes_map else looped_layout)(trainer.model)
    except ValueError as error:
        raise ValueError(f"--serving_output_dir {folder}: {error}") from None


def _text_data_and_model(task: LanguageModelingTask, model_args: ModelArguments, data_args: DataTrainingArguments):
    """Text from a dataset, files or the embedded corpus, its tokenizer and the model, tokenized into blocks. The
    tokenizer and the model come first: what is wrong with them (a model type, a context shorter than --block_size)
    is reported before a dataset is downloaded and read."""
    flag, name = _tokenizer_source(model_args, task)
    tokenizer = load_tokenizer(name, masked=task.masked, flag=flag, **model_args.hub_options)
    model = _load_model(task, model_args, tokenizer)
    block_size = resolve_block_size(data_args.block_size, model.config.max_position_embeddings)
    raw = load_text_datasets(
        data_args.dataset_name,
        data_args.dataset_config_name,
        data_args.train_file,
        data_args.validation_file,
        data_args.validation_split_percentage,
        data_args.keep_linebreaks,
        model_args.cache_dir,
        streaming=data_args.streaming,
    )
    grouped = tokenize_and_group(
        raw,
        tokenizer,
        text_column(raw, data_args.text_column_name),
        block_size,
        num_proc=data_args.preprocessing_num_workers,
        special_tokens_mask=task.masked,
        source=_data_source(data_args),
    )
    return grouped, tokenizer, model


def _tokenizer_source(model_args: ModelArguments, task: LanguageModelingTask) -> tuple[str, str]:
    """The argument the tokenizer comes from and its value, as transformers' run_clm.py picks it, so that an error
    about the tokenizer names what the user passed."""
    if model_args.tokenizer_name:
        return "--tokenizer_name", model_args.tokenizer_name
    if model_args.model_name_or_path:
        return "--model_name_or_path", model_args.model_name_or_path
    return "the embedded default's tokenizer", task.tokenizer


def _load_model(task: LanguageModelingTask, model_args: ModelArguments, tokenizer) -> PreTrainedModel:
    if model_args.model_name_or_path is not None:
        model_type = tied_model_type(model_args.model_name_or_path, model_args.model_type, **model_args.hub_options)
    else:
        model_type = model_args.model_type or task.model_types[0]
    if model_type not in task.model_types:
        raise ValueError(f"--model_type {model_type!r} does not fit run_{task.name}.py; expected one of {', '.join(task.model_types)}")
    return load_model(
        model_type,
        tokenizer,
        model_args.model_name_or_path,
        model_args.config_overrides,
        looped_config=model_args.looped_config,
        **model_args.loading_options,
        **model_args.hub_options,
    )


def _training_blocks(train, data_args: DataTrainingArguments, training_args: TyingTrainingArguments):
    """The blocks training reads and the held-out reward's (None without one): the training split less the reward's
    blocks, cut to --max_train_samples."""
    reward = None
    if training_args.reward_source == "held_out":
        train, reward = split_reward_examples(train, training_args.reward_batch_size)
    return take_first(train, data_args.max_train_samples), reward


def _collator(task: LanguageModelingTask, tokenizer, mlm_probability: float):
    if task.masked:
        return _MaskedLanguageModelingCollator(DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability))
    return default_data_collator


@dataclass
class _MaskedLanguageModelingCollator:
    """Training blocks masked anew in each batch by transformers' collator; blocks that carry their `labels` (the
    evaluation's and a held-out reward's, masked once by `mask_evaluation_blocks`) stacked as they are."""

    masking: DataCollatorForLanguageModeling

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if "labels" in examples[0]:
            return default_data_collator(examples)
        return self.masking(examples)


def _baseline(task: LanguageModelingTask, tokenizer, counted, evaluated) -> dict[str, float]:
    """The count baseline of the same tokenization (`hf_layertie.toolkit.baselines`), counted on `counted` (the
    training blocks, as the same command trains on them when the model only evaluates) and scored on the blocks the
    model was evaluated on; none without training text to count (a --validation_file alone)."""
    if counted is None:
        return {}
    train = counted.with_format("torch")["input_ids"]
    if task.masked:  # the tokens the model was asked for: the evaluation blocks' labels
        scored = [labels[labels != -100] for labels in evaluated.with_format("torch")["labels"]]
        return {"eval_unigram_loss": unigram_loss(train, scored, len(tokenizer), tokenizer.all_special_ids)}
    return {"eval_bigram_loss": bigram_loss(train, evaluated.with_format("torch")["input_ids"], len(tokenizer))}


def _print_report(task, metrics: dict, model, tokenizer, validation, max_new_tokens: int) -> None:
    """The held-out loss beside the count baseline, then a sample of what the model writes or fills in."""
    baseline_key = "eval_unigram_loss" if task.masked else "eval_bigram_loss"
    if "eval_loss" in metrics:
        print(f"\n***** held-out loss, nats per token ({metrics['eval_samples']} evaluation blocks) *****")
        print(f"  this model            {metrics['eval_loss']:.3f}   (perplexity {metrics['perplexity']:,.1f})")
    if baseline_key in metrics:
        baseline = "count unigram" if task.masked else "count bigram"
        print(f"  {baseline:<20}  {metrics[baseline_key]:.3f}   (perplexity {perplexity(metrics[baseline_key]):,.1f})")
    if max_new_tokens > 0:
        sample = _fill_mask_sample(model, tokenizer, validation[0]["input_ids"]) if task.masked else _generated_sample(
            model, tokenizer, validation[0]["input_ids"], max_new_tokens
        )
        print(f"\n***** sample (seed {SAMPLE_SEED}) *****\n{sample}\n")


def _generated_sample(model, tokenizer, block: list[int], max_new_tokens: int) -> str:
    """The first 16 tokens of the first evaluation block, continued by sampling (top-k 40, temperature 0.8) up to
    `max_new_tokens` or the model's context, whichever comes first."""
    prompt = torch.tensor([block[:16]], device=model.device)
    max_new_tokens = min(max_new_tokens, model.config.max_position_embeddings - prompt.shape[1])
    if max_new_tokens < 1:
        return f"[prompt] {tokenizer.decode(block[:16])}\n[model]  (none: the prompt fills the model's context)"
    torch.manual_seed(SAMPLE_SEED)
    model.eval()
    with torch.no_grad():
        output = model.generate(
            prompt, max_new_tokens=max_new_tokens, do_sample=True, top_k=40, temperature=0.8, pad_token_id=tokenizer.eos_token_id
        )
    return f"[prompt] {tokenizer.decode(block[:16])}\n[model]  {tokenizer.decode(output[0, prompt.shape[1] :])}"


def _fill_mask_sample(model, tokenizer, block: list[int]) -> str:
    """A stretch of the first evaluation block with one whole word masked, and the model's three best fillers."""
    ids = [token for token in block if token not in tokenizer.all_special_ids][:24]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    whole_words = [
        index
        for index in range(len(ids) // 2, len(ids) - 1)
        if pieces[index].isalpha() and not pieces[index + 1].startswith("##")
    ]
    position = whole_words[0] if whole_words else len(ids) // 2
    masked = ids[:position] + [tokenizer.mask_token_id] + ids[position + 1 :]
    fill_mask = pipeline("fill-mask", model=model, tokenizer=tokenizer, device=model.device)
    guesses = fill_mask(tokenizer.decode(masked), top_k=3)
    answers = ", ".join(f"{guess['token_str']!r} ({guess['score']:.2f})" for guess in guesses)
    return f"[text]   {tokenizer.decode(masked)}\n[truth]  {pieces[position]!r}\n[model]  {answers}"


def _data_source(data_args: DataTrainingArguments) -> str:
    """Where the text came from, as the user named it (for errors about its rows)."""
    if data_args.dataset_name is not None:
        return f"--dataset_name {data_args.dataset_name}"
    if data_args.train_file is not None:
        files = [data_args.train_file] + ([data_args.validation_file] if data_args.validation_file else [])
        return f"--train_file/--validation_file {' / '.join(files)}"
    if data_args.validation_file is not None:
        return f"--validation_file {data_args.validation_file}"
    return "the embedded Shakespeare corpus"


def _asked_beyond_saved(
    training_args: TyingTrainingArguments, data_args: DataTrainingArguments, saved: dict[str, float], output_dir: str
) -> list[str]:
    """What this command asks of a finished run that its saved results lack: an evaluation, or one of other data
    than the saved evaluation's; a push to the Hub."""
    asked = []
    if training_args.do_eval and "eval_loss" not in saved:
        asked.append("an evaluation (--do_eval)")
    elif training_args.do_eval and not (Path(output_dir) / EVALUATION_SETTINGS_FILE).is_file():
        asked.append("an evaluation recording its data settings (the saved one has none, so its data is unknown)")
    elif training_args.do_eval and (changed := _evaluation_settings_changed(data_args, training_args, output_dir)):
        asked.append(f"an evaluation with {', '.join(changed)} (the saved one had other data settings)")
    if training_args.push_to_hub:
        asked.append("a push to the Hub (--push_to_hub)")
    if data_args.serving_output_dir is not None and not (Path(data_args.serving_output_dir) / "config.json").is_file():
        asked.append("a serving export (--serving_output_dir)")
    return asked


def _evaluation_settings(data_args: DataTrainingArguments, training_args: TyingTrainingArguments) -> dict:
    """What picks and shapes the evaluated blocks: the data flags (`evaluation_settings`) and the seeds a masked
    model's evaluation masks and a generated task's examples are drawn from."""
    return {**data_args.evaluation_settings(), "seed": training_args.seed, "data_seed": training_args.data_seed}


def _evaluation_settings_changed(
    data_args: DataTrainingArguments, training_args: TyingTrainingArguments, output_dir: str
) -> list[str]:
    """The flags this command gives otherwise than the evaluation saved in `output_dir` had them."""
    saved = json.loads((Path(output_dir) / EVALUATION_SETTINGS_FILE).read_text())
    wanted = _evaluation_settings(data_args, training_args)
    return [f"--{name} {value}" for name, value in wanted.items() if name not in saved or saved[name] != value]


def _drop_saved_evaluation(trainer: TyingTrainer, output_dir: str) -> None:
    """Forget the evaluation saved in `output_dir`: eval_results.json, and its keys in all_results.json, into which
    `Trainer.save_metrics` merges every split's metrics (an evaluation of other data, or of an earlier model, would
    leave keys the next one does not write)."""
    if not trainer.is_world_process_zero():
        return
    for name in ("eval_results.json", EVALUATION_SETTINGS_FILE):
        (Path(output_dir) / name).unlink(missing_ok=True)
    path = Path(output_dir) / "all_results.json"
    if path.is_file():
        kept = {key: value for key, value in json.loads(path.read_text()).items() if not key.startswith(("eval_", "perplexity"))}
        path.write_text(json.dumps(kept, indent=4, sort_keys=True))


def _dataset_label(data_args: DataTrainingArguments) -> str:
    """How the card names the data. Only a dataset loaded by name is a Hub id (the card's `datasets:` metadata);
    the others say what they are, so that no file or generated task passes for a Hub dataset."""
    if data_args.dataset_name in HOP_TASKS:
        return hop_task_label(data_args.dataset_name, data_args.dataset_config_name)
    if data_args.dataset_name is not None:
        return data_args.dataset_name
    data_file = data_args.train_file or data_args.validation_file
    if data_file is not None:
        return f"{Path(data_file).name} (local file)"
    return "Shakespeare (embedded in hf-layertie)"
