"""Loading, checking, tokenizing and grouping text for the language-modeling scripts.

Errors name the argument and the file: a user who typed a wrong path or column should not have to
read a stack of `datasets` internals to find out.
"""

from __future__ import annotations

import logging
import os
from itertools import chain

import datasets
from transformers import PreTrainedTokenizerBase, TrainingArguments

from ..data import load_embedded_corpus
from .arguments import DataTrainingArguments, ModelArguments

logger = logging.getLogger(__name__)

BUILDER_BY_EXTENSION = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv"}


def load_raw_datasets(data_args: DataTrainingArguments, model_args: ModelArguments) -> datasets.DatasetDict:
    """`train` and `validation` splits from a `datasets` name, from files, or from the embedded corpus."""
    if data_args.dataset_name is not None:
        raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=model_args.cache_dir)
        source = f"--dataset_name {data_args.dataset_name}"
    elif data_args.train_file is not None:
        raw = _load_files(data_args, model_args)
        source = f"--train_file {data_args.train_file}"
    else:
        logger.info("No dataset or files given: using the Shakespeare corpus shipped with hf-layertie")
        raw = load_embedded_corpus()
        source = "the embedded Shakespeare corpus"
    if "validation" not in raw:
        raw = _split_validation(raw["train"], data_args.validation_split_percentage)
    for split in ("train", "validation"):
        if len(raw[split]) == 0:
            raise ValueError(f"The {split} split of {source} has no rows")
    return datasets.DatasetDict({"train": raw["train"], "validation": raw["validation"]})


def _load_files(data_args: DataTrainingArguments, model_args: ModelArguments) -> datasets.DatasetDict:
    files = {"train": _check_data_file(data_args.train_file, "--train_file")}
    if data_args.validation_file is not None:
        files["validation"] = _check_data_file(data_args.validation_file, "--validation_file")
    builders = {BUILDER_BY_EXTENSION[os.path.splitext(path)[1].lower()] for path in files.values()}
    if len(builders) > 1:
        raise ValueError(f"--train_file and --validation_file must have the same format, got {sorted(files.values())}")
    builder = builders.pop()
    options = {"keep_linebreaks": data_args.keep_linebreaks} if builder == "text" else {}
    try:
        return datasets.load_dataset(builder, data_files=files, cache_dir=model_args.cache_dir, **options)
    except (datasets.exceptions.DatasetGenerationError, ValueError) as error:
        raise ValueError(f"Could not read {', '.join(files.values())} as {builder}: {error}") from error


def _check_data_file(path: str, argument: str) -> str:
    extension = os.path.splitext(path)[1].lower()
    if extension not in BUILDER_BY_EXTENSION:
        raise ValueError(f"{argument} {path}: expected a {', '.join(BUILDER_BY_EXTENSION)} file, got {extension or 'no extension'!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{argument} {path}: no such file")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{argument} {path}: the file is empty")
    return path


def _split_validation(train: datasets.Dataset, percentage: int) -> datasets.DatasetDict:
    """The last `percentage`% of rows become the validation split (fixed, no shuffling)."""
    num_validation = max(1, len(train) * percentage // 100)
    if num_validation >= len(train):
        raise ValueError(f"Too little data ({len(train)} rows) to hold out {percentage}% for validation")
    return datasets.DatasetDict(
        {
            "train": train.select(range(len(train) - num_validation)),
            "validation": train.select(range(len(train) - num_validation, len(train))),
        }
    )


def text_column(raw: datasets.DatasetDict, requested: str | None) -> str:
    columns = raw["train"].column_names
    if requested is not None:
        if requested not in columns:
            raise ValueError(f"--text_column_name {requested!r} is not a column of the data; its columns are {columns}")
        return requested
    return "text" if "text" in columns else columns[0]


def resolve_block_size(requested: int | None, context: int) -> int:
    """The training length: `requested`, which must fit the model's context, or min(context, 1024)."""
    if requested is None:
        return min(context, 1024)
    if requested > context:
        raise ValueError(f"--block_size {requested} is larger than the model's context of {context} positions")
    return requested


def tokenize_and_group(
    raw: datasets.DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    column: str,
    block_size: int,
    training_args: TrainingArguments,
    num_proc: int | None = None,
    special_tokens_mask: bool = False,
) -> datasets.DatasetDict:
    """Tokenize every row, concatenate and cut into `block_size` chunks (the remainder is dropped).

    Causal LM chunks get `labels` (the model shifts them); masked LM asks for the special-tokens mask
    so the collator never masks [CLS] / [SEP].
    """

    def tokenize(batch):
        return tokenizer(batch[column], return_special_tokens_mask=special_tokens_mask)

    def group(batch):
        concatenated = {key: list(chain(*batch[key])) for key in batch}
        length = len(concatenated["input_ids"]) // block_size * block_size
        chunks = {
            key: [values[start : start + block_size] for start in range(0, length, block_size)]
            for key, values in concatenated.items()
        }
        if not special_tokens_mask:
            chunks["labels"] = [list(ids) for ids in chunks["input_ids"]]
        return chunks

    with training_args.main_process_first(desc="tokenizing and grouping"):
        tokenized = raw.map(
            tokenize, batched=True, num_proc=num_proc, remove_columns=raw["train"].column_names, desc="Tokenizing"
        )
        grouped = tokenized.map(group, batched=True, num_proc=num_proc, desc=f"Grouping into blocks of {block_size}")
    for split in ("train", "validation"):
        if len(grouped[split]) == 0:
            raise ValueError(
                f"The {split} split holds fewer than --block_size={block_size} tokens: lower --block_size or add data"
            )
    return grouped


def hold_out_reward_batch(train: datasets.Dataset, count: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Split off the first `count` training examples as the agent's reward batch: `(train, reward)`.

    They are never trained on and are not the evaluation data. Held out for every tying strategy, so that
    all strategies train on the same examples and compare like with like.
    """
    if len(train) <= count:
        raise ValueError(
            f"The training data has {len(train)} examples; --reward_batch_size {count} of them are held out for the "
            f"tying reward, so at least {count + 1} are needed: add data or lower --block_size / --reward_batch_size"
        )
    return train.select(range(count, len(train))), train.select(range(count))
