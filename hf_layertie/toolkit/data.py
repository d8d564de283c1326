"""Loading, checking, tokenizing and grouping text, as transformers' language-modeling examples do it.

Errors name the argument and the file: a user who typed a wrong path or column should not have to read a
stack of `datasets` internals to find out. Every function takes plain values; the scripts pass their
command-line arguments in.
"""

from __future__ import annotations

import logging
import os
from itertools import chain

import datasets
import torch
from accelerate import PartialState
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..data import load_embedded_corpus

logger = logging.getLogger(__name__)

BUILDER_BY_EXTENSION = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv"}


def has_own_validation_split(dataset_name: str, dataset_config_name: str | None = None, cache_dir: str | None = None) -> bool:
    """Whether a `datasets` name (a Hub id or a local folder) holds a `validation` split, from its split names,
    read without loading it; False where they cannot be read (no network, an unknown name: `load_dataset` says
    what is wrong when it runs)."""
    try:
        names = datasets.get_dataset_split_names(dataset_name, dataset_config_name, cache_dir=cache_dir)
    except Exception:  # noqa: BLE001 (the answer is only 'not known to have one')
        return False
    return "validation" in names


def load_text_datasets(
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    validation_split_percentage: int = 5,
    keep_linebreaks: bool = True,
    cache_dir: str | None = None,
    streaming: bool = False,
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    """`train` and `validation` splits from a `datasets` name, from files, or (neither given) the shipped
    Shakespeare corpus, split by play. A source without a validation split gives up its last
    `validation_split_percentage`% of rows; a `validation_file` alone gives the `validation` split alone (to
    evaluate on).

    `streaming`: `IterableDataset`s read as they are iterated (`datasets` streaming). A stream's end is unknown, so a
    source without a validation split holds out every row whose index modulo 100 is below
    `validation_split_percentage` (as transformers' run_clm.py does), and empty splits are found when they are read.
    """
    if dataset_name is not None:
        raw = datasets.load_dataset(dataset_name, dataset_config_name, cache_dir=cache_dir, streaming=streaming)
        source = f"--dataset_name {dataset_name}"
    elif train_file is not None or validation_file is not None:
        raw = _load_files(train_file, validation_file, keep_linebreaks, cache_dir, streaming)
        source = f"--train_file {train_file}" if train_file is not None else f"--validation_file {validation_file}"
    else:
        logger.info("No dataset or files given: using the Shakespeare corpus shipped with hf-layertie")
        raw = load_embedded_corpus(streaming=streaming)
        source = "the embedded Shakespeare corpus"
    if not {"train", "validation"} & raw.keys():
        raise ValueError(
            f"{source} has the splits {', '.join(raw)}: it needs a 'train' split (part of it is held out for "
            "validation) or a 'validation' split"
        )
    if "validation" not in raw:
        split = _split_validation_stream if streaming else _split_validation
        raw = split(raw["train"], validation_split_percentage)
    splits = [split for split in ("train", "validation") if split in raw]
    if streaming:
        return datasets.IterableDatasetDict({split: raw[split] for split in splits})
    for split in splits:
        if len(raw[split]) == 0:
            raise ValueError(f"The {split} split of {source} has no rows")
    return datasets.DatasetDict({split: raw[split] for split in splits})


def _load_files(
    train_file: str | None, validation_file: str | None, keep_linebreaks: bool, cache_dir: str | None, streaming: bool = False
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    named = {"train": (train_file, "--train_file"), "validation": (validation_file, "--validation_file")}
    files = {split: _check_data_file(path, flag) for split, (path, flag) in named.items() if path is not None}
    builders = {BUILDER_BY_EXTENSION[os.path.splitext(path)[1].lower()] for path in files.values()}
    if len(builders) > 1:
        raise ValueError(f"--train_file and --validation_file must have the same format, got {sorted(files.values())}")
    builder = builders.pop()
    options = {"keep_linebreaks": keep_linebreaks} if builder == "text" else {}
    try:
        return datasets.load_dataset(builder, data_files=files, cache_dir=cache_dir, streaming=streaming, **options)
    except (datasets.exceptions.DatasetGenerationError, ValueError, UnicodeDecodeError) as error:
        cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
        raise ValueError(f"Could not read {', '.join(files.values())} as {builder}: {error}{cause}") from error


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
        raise ValueError(
            f"Too little data ({len(train)} rows) to hold out --validation_split_percentage {percentage}% for "
            "validation: give more data, or data with a validation split of its own"
        )
    return datasets.DatasetDict(
        {
            "train": train.select(range(len(train) - num_validation)),
            "validation": train.select(range(len(train) - num_validation, len(train))),
        }
    )


def _split_validation_stream(train: datasets.IterableDataset, percentage: int) -> datasets.IterableDatasetDict:
    """Rows whose index modulo 100 is below `percentage` become the validation split (a stream's end is unknown)."""
    return datasets.IterableDatasetDict(
        {
            "train": train.filter(lambda _, index: index % 100 >= percentage, with_indices=True),
            "validation": train.filter(lambda _, index: index % 100 < percentage, with_indices=True),
        }
    )


def column_names(dataset: datasets.Dataset | datasets.IterableDataset) -> list[str]:
    """The dataset's columns; a stream whose features are unknown until read (`text`, `json`) is read for one row."""
    if dataset.column_names is not None:
        return dataset.column_names
    first = next(iter(dataset), None)
    return list(first) if first is not None else []


def text_column(raw: datasets.DatasetDict | datasets.IterableDatasetDict, requested: str | None) -> str:
    """The column that holds the text: `requested`, else `text`, else the first column (said in the log)."""
    columns = column_names(next(iter(raw.values())))
    if not columns:
        raise ValueError(f"The {next(iter(raw))} split has no rows")
    if requested is not None:
        if requested not in columns:
            raise ValueError(f"--text_column_name {requested!r} is not a column of the data; its columns are {columns}")
        return requested
    if "text" in columns:
        return "text"
    logger.warning(f"The data has no 'text' column; training on its first column, {columns[0]!r} (--text_column_name chooses)")
    return columns[0]


def resolve_block_size(requested: int | None, context: int) -> int:
    """The training length: `requested`, which must fit the model's context, or min(context, 1024)."""
    if requested is None:
        return min(context, 1024)
    if requested > context:
        raise ValueError(f"--block_size {requested} is larger than the model's context of {context} positions")
    return requested


def fit_tokenizer_to_model(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> None:
    """Set the tokenizer's `model_max_length` to the model's context (`max_position_embeddings`): the tokenizer is
    saved beside the model, and evaluators truncate inputs to it (a shipped tokenizer says 1024 or 512, whatever the
    model's positions). Call it once the training data is tokenized: rows cut into blocks may be longer, and the
    tokenizer would warn about them."""
    tokenizer.model_max_length = model.config.max_position_embeddings


def mask_evaluation_blocks(
    blocks: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    mlm_probability: float,
    seed: int,
    description: str = "evaluation blocks",
) -> datasets.Dataset:
    """A masked LM's held-out blocks (`description`: its evaluation's, a held-out reward's), masked once (`input_ids`
    masked, `labels` the tokens to predict; the `special_tokens_mask` they replace dropped), so that every evaluation
    scores the same tokens and the printed loss is their mean.

    `DataCollatorForLanguageModeling` draws new masks per batch from the global random state (another loss at
    each evaluation of one model), and the Trainer averages each batch's mean with the batch's rows as weights,
    which is the mean over scored tokens only where every row scores as many. So every block scores the same
    number of tokens: `mlm_probability` of the median block's maskable tokens (those outside `all_special_ids`,
    which the collator never masks either), as the collator masks on average; a block holding fewer maskable
    tokens than that is left out, with a warning. The tokens are chosen at random and replaced as BERT does: 80%
    by the mask token, 10% by a random token, 10% kept.
    """
    special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    ids = torch.tensor(blocks["input_ids"], dtype=torch.long)
    maskable = ~torch.isin(ids, special_ids)
    per_block = maskable.sum(dim=1)
    count = max(1, round(mlm_probability * float(per_block.float().median())))
    kept = (per_block >= count).nonzero().flatten()
    if len(kept) == 0:
        raise ValueError(f"none of the {description} holds a token a masked model could be asked for (all are special tokens)")
    if len(kept) < len(ids):
        logger.warning(
            f"{len(ids) - len(kept)} of {len(ids)} {description} hold fewer than {count} maskable tokens (the "
            f"{mlm_probability} of the median block's masked in every block): they are left out"
        )
        blocks, ids, maskable = blocks.select(kept.tolist()), ids[kept], maskable[kept]
    generator = torch.Generator().manual_seed(seed)
    # The `count` maskable positions of lowest draw in each block; special positions draw above every other.
    draws = torch.rand(ids.shape, generator=generator).masked_fill(~maskable, 2.0)
    chosen = torch.zeros_like(maskable).scatter(1, draws.argsort(dim=1)[:, :count], True)
    replacement = torch.rand(ids.shape, generator=generator)
    random_tokens = torch.randint(len(tokenizer), ids.shape, generator=generator)
    masked = ids.masked_fill(chosen & (replacement < 0.8), tokenizer.mask_token_id)
    masked = torch.where(chosen & (replacement >= 0.8) & (replacement < 0.9), random_tokens, masked)
    others = {name: blocks[name] for name in blocks.column_names if name not in ("input_ids", "labels", "special_tokens_mask")}
    return datasets.Dataset.from_dict({**others, "input_ids": masked.tolist(), "labels": ids.masked_fill(~chosen, -100).tolist()})


def tokenize_and_group(
    raw: datasets.DatasetDict | datasets.IterableDatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    column: str,
    block_size: int,
    num_proc: int | None = None,
    special_tokens_mask: bool = False,
    source: str = "the data",
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    """Tokenize every row, concatenate and cut into `block_size` chunks (the remainder is dropped).

    Causal LM chunks get `labels` (the model shifts them); masked LM asks for the special-tokens mask so the
    collator never masks [CLS] / [SEP]. The main process works first; the others read its cache. A text column
    that is not text (numbers, nulls) is refused naming `source` (the flag and file it came from), the column and
    the row.

    Streams (`IterableDatasetDict`) are tokenized and grouped as they are read, 1,000 rows at a time as the
    datasets are (so into the same blocks); each split is read up to its first block here, to refuse an empty one.
    """
    for split in raw:
        _check_text_feature(raw[split], column, f"the {split} split of {source}")

    def tokenize(batch, indices, where):
        for index, text in zip(indices, batch[column]):
            if not isinstance(text, str):
                raise ValueError(
                    f"Row {index} (counted from 0) of {where} holds {text!r} in the text column {column!r}: every "
                    f"row needs a string (fix the row, or pick another column with --text_column_name)"
                )
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

    streamed = isinstance(raw, datasets.IterableDatasetDict)
    if streamed and num_proc is not None:
        logger.warning("--preprocessing_num_workers does not apply to a stream: it is tokenized as training reads it")

    def options(description: str) -> dict:
        """A stream is mapped as it is read: no worker processes, no progress bar."""
        return {} if streamed else {"num_proc": num_proc, "desc": description}

    def blocks(split: str, dataset):
        where = f"the {split} split of {source}"
        remove = column_names(dataset)
        tokens = dataset.map(tokenize, fn_kwargs={"where": where}, batched=True, with_indices=True, remove_columns=remove, **options("Tokenizing"))
        return tokens.map(group, batched=True, **options(f"Grouping into blocks of {block_size}"))

    if streamed:
        grouped = datasets.IterableDatasetDict({split: blocks(split, dataset) for split, dataset in raw.items()})
        empty = [split for split, chunks in grouped.items() if next(iter(chunks), None) is None]
    else:
        # One process per machine tokenizes first and writes the cache its machine's others read (transformers'
        # run_clm.py default: machines need not share a filesystem).
        with PartialState().local_main_process_first():
            grouped = datasets.DatasetDict({split: blocks(split, dataset) for split, dataset in raw.items()})
        empty = [split for split, chunks in grouped.items() if len(chunks) == 0]
    for split in empty:
        raise ValueError(
            f"The {split} split holds fewer than --block_size={block_size} tokens: lower --block_size or add data"
        )
    return grouped


def _check_text_feature(dataset: datasets.Dataset | datasets.IterableDataset, column: str, where: str) -> None:
    if dataset.features is None:  # a stream's features are unknown until read: `tokenize` checks each row
        return
    feature = dataset.features[column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string", "null")):
        raise ValueError(
            f"The text column {column!r} of {where} holds {feature}, not text: pick the column of strings with "
            f"--text_column_name (columns: {dataset.column_names})"
        )


def split_reward_examples(
    train: datasets.Dataset | datasets.IterableDataset, count: int
) -> tuple[datasets.Dataset | datasets.IterableDataset, datasets.Dataset]:
    """Split off the first `count` training examples as the fixed batch of a held-out reward: `(train, reward)`.

    The one place a reward batch is carved (`reward_source="held_out"`): they are never trained on and are not
    the evaluation data. From a stream, they are read into memory and the stream skips them.
    """
    if isinstance(train, datasets.IterableDataset):
        reward = read_stream(train, count)
        if len(reward) == count:
            return train.skip(count), reward
        available = len(reward)
    elif len(train) > count:
        return train.select(range(count, len(train))), train.select(range(count))
    else:
        available = len(train)
    raise ValueError(
        f"The training data has {available} examples; --reward_batch_size {count} of them are held out for the "
        f"tying reward, so at least {count + 1} are needed: add data or lower --block_size / --reward_batch_size"
    )


def take_first(dataset: datasets.Dataset | datasets.IterableDataset, count: int | None):
    """The first `count` examples (all of them for None); of a stream, a stream of them."""
    if count is None:
        return dataset
    if isinstance(dataset, datasets.IterableDataset):
        return dataset.take(count)
    return dataset.select(range(min(count, len(dataset))))


def read_stream(stream: datasets.IterableDataset, count: int) -> datasets.Dataset:
    """The first `count` examples of `stream` (fewer if it ends first), read into an in-memory `Dataset`."""
    rows = list(stream.take(count))
    return datasets.Dataset.from_list(rows) if rows else datasets.Dataset.from_dict({})
