"""What the generated tasks share: reading their settings, bounding their size, their word-level tokenizer and
their seeded splits.

A generated task is made from a seed, with no download: a frozen config dataclass (`from_string` reads
`--dataset_config_name`, `sequence_length` is the padded length of its examples), a function of the config and a
seed that returns the `train`, `validation` and `test` splits (`generated_splits`), and a tokenizer of the config
(`word_level_tokenizer`). Its examples hold `input_ids`, `attention_mask`, `labels` (the supervised tokens,
`IGNORE_INDEX` elsewhere) and `answer_hops` (each label's number of hops, in order), so that one evaluation scores
every task by hop count (`hf_layertie.language_modeling.generated_tasks`, which names the tasks `run_clm.py`
offers). The task: k-hop induction (`hop_induction`).
"""

from __future__ import annotations

import dataclasses
import logging

import datasets
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
# The most tokens (examples x sequence length) one split of a generated task may hold. Each split is generated in
# memory as Python lists, about 120 bytes a token over its columns (5.1M tokens, a split of the chains-of-references
# task since removed, took 0.6 GB and 12 s), so a split at the bound takes about 2.4 GB and a minute: a bound far
# above the tasks' use (at most 13M tokens in bench/) and below what a small machine holds, so that a mistyped size
# is refused at once.
MAX_SPLIT_TOKENS = 20_000_000


def read_task_settings(task: str, text: str, config_class: type, text_fields: tuple[str, ...] = ()) -> dict[str, object]:
    """`"key=value,key=value"` as `{key: value}` for `config_class` (a task's settings dataclass): every key one of its
    fields and given once (a repeated key would silently keep its last value), every value an integer but those of
    `text_fields`. Errors name the task and the key."""
    names = sorted(field.name for field in dataclasses.fields(config_class))
    values: dict[str, object] = {}
    for item in text.split(","):
        key, _, value = (part.strip() for part in item.partition("="))
        if key not in names:
            raise ValueError(f"{task} setting {key!r} is unknown; settings: {', '.join(names)}")
        if key in values:
            raise ValueError(f"{task} setting {key!r} is given twice ({key}={values[key]}, {key}={value}): give it once")
        values[key] = value
    for key, value in values.items():
        if key not in text_fields:
            try:
                values[key] = int(value)
            except ValueError:
                raise ValueError(f"{task} {key} must be an integer, got {value!r}") from None
    return values


def check_split_sizes(task: str, train_examples: int, eval_examples: int, sequence_length: int) -> None:
    """Refuse a split of more than `MAX_SPLIT_TOKENS` tokens, naming the setting and its largest value."""
    for name, count in (("train_examples", train_examples), ("eval_examples", eval_examples)):
        if count * sequence_length > MAX_SPLIT_TOKENS:
            raise ValueError(
                f"{task} {name}={count} makes a split of {count * sequence_length:,} tokens ({count} examples of "
                f"{sequence_length}), above the {MAX_SPLIT_TOKENS:,} a split is generated in memory with: pass "
                f"{name}={MAX_SPLIT_TOKENS // sequence_length} or less"
            )


def word_level_tokenizer(vocabulary: list[str], pad: str) -> PreTrainedTokenizerFast:
    """One id per word of `vocabulary` (in order), words split on whitespace; `pad` pads and ends sequences (the
    generated tasks' tokenizers)."""
    tokenizer = Tokenizer(models.WordLevel({token: index for index, token in enumerate(vocabulary)}, unk_token=pad))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=pad, eos_token=pad)


def generated_splits(rows, train_examples: int, eval_examples: int, seed: int) -> datasets.DatasetDict:
    """Train, validation and test of a generated task, `rows(count, seed)` each, from seeds far apart: no split
    repeats another's stream of examples, and each is the same for the same `seed`. An evaluation example seen
    before (a training example, one earlier in its split, or, for test, a validation example: the settings of a
    small task allow few distinct examples) is left out, with a warning: a model that memorised it would be scored
    on it, and a repeat would count twice."""
    train = rows(train_examples, seed)
    seen = {tuple(ids) for ids in train["input_ids"]}
    splits = {"train": datasets.Dataset.from_dict(train)}
    for split, offset in (("validation", 1_000_003), ("test", 2_000_006)):
        columns = rows(eval_examples, seed + offset)
        unseen = []
        for index, ids in enumerate(columns["input_ids"]):
            if tuple(ids) not in seen:
                unseen.append(index)
                seen.add(tuple(ids))
        if not unseen:
            raise ValueError(
                f"every generated {split} example repeats a training example or one held out before it: the task's "
                "settings allow too few distinct examples to hold any out (make them longer or more varied)"
            )
        if len(unseen) < eval_examples:
            logger.warning(
                f"{eval_examples - len(unseen)} of the {eval_examples} generated {split} examples repeat a training "
                "example or one held out before them (the task's settings allow few distinct examples): they are left out"
            )
            columns = {name: [values[index] for index in unseen] for name, values in columns.items()}
        splits[split] = datasets.Dataset.from_dict(columns)
    return datasets.DatasetDict(splits)
