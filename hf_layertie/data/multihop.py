"""A task where depth matters: follow chains of variable references (`c = b ; b = a ; a = 7 ; ? c 7`).

Each example holds `num_chains` chains of variables, each of a length drawn uniformly from 1..`max_hops`: a chain's
first variable gets a digit (`a = 7`), every other one the previous variable (`b = a`). The assignments of all
chains are shuffled together (or kept in chain order, chains interleaved: `order="in_order"`), then the last
variable of `num_queries` of the chains is queried, in random order (`? c 7`). The answer is the digit at the start
of its chain, and its number of hops is the number of assignments to follow to reach it: the chain's length. A
chain is queried at most once, so no answer can be copied from an earlier one, and the chains never queried are
distractors: with every chain queried, the digits already answered would give the last answers away by
elimination (a 2-block model reached 0.58 accuracy that way, equal at every hop count). Examples are right-padded
to one length.
With shuffled assignments a causal model can only resolve a chain at the query, one reference per attention
step, so a deeper model can follow longer chains: the regime where looped and tied deep models are reported to
beat shallow ones at equal parameters.

Two more settings change the format, found with `bench/multihop_probe.py` (bench/README.md, "Where depth matters: k-hop induction"):
`tokens="pairs"` writes each assignment as one token (`c=b`, queries `?c 7`), so that a block can resolve one
reference by attending to one token; `queries="any"` asks for any variable of any chain (the same chain may be
asked twice; a variable's hops are its position in its chain), so that every example holds short and long
questions; `min_hops` = `max_hops` gives every chain the same length, so the chains cannot be told apart by
their lengths (a shortcut a 1-block model used: it answered 2-hop questions of 1- and 2-hop chains at 0.68).

The labels are the answer tokens only (-100 elsewhere), so the loss is the answers' loss; `answer_hops` holds
each answer's number of hops, in order, for accuracy per hop count (`hf_layertie.metrics` `multihop_accuracy`).
Everything is generated from a seed: no download.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from dataclasses import dataclass

import datasets
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

SYMBOLS = ("<pad>", "=", ";", "?")
IGNORE_INDEX = -100
# The most tokens (examples x sequence length) one split of a generated task may hold. Each split is generated in
# memory as Python lists, about 120 bytes a token over its columns (5.1M tokens, the default multihop train split,
# took 0.6 GB and 12 s), so a split at the bound takes about 2.4 GB and a minute: a bound far above the tasks' use
# (at most 13M tokens in bench/) and below what a small machine holds, so that a mistyped size is refused at once.
MAX_SPLIT_TOKENS = 20_000_000


def read_task_settings(task: str, text: str, names) -> dict[str, str]:
    """`"key=value,key=value"` as `{key: value}`, every key one of `names` and given once (a repeated key would
    silently keep its last value)."""
    values = {}
    for item in text.split(","):
        key, _, value = (part.strip() for part in item.partition("="))
        if key not in names:
            raise ValueError(f"{task} setting {key!r} is unknown; settings: {', '.join(names)}")
        if key in values:
            raise ValueError(f"{task} setting {key!r} is given twice ({key}={values[key]}, {key}={value}): give it once")
        values[key] = value
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


@dataclass(frozen=True)
class MultiHopConfig:
    """The size of the task; `from_string("num_variables=12,max_hops=6")` reads `--dataset_config_name`.

    Args:
        num_chains: chains per example.
        num_queries: questions per example; with `queries="last"`, chains queried (the others are distractors), at
            most `num_chains`.
        max_hops: longest chain; chain lengths are drawn uniformly from min_hops..max_hops.
        min_hops: shortest chain (1 unless told).
        num_names: variable names to draw from (`v0` ... ), at least `num_chains * max_hops`.
        num_values: digits a chain can end in.
        order: `"shuffled"` assignments, or `"in_order"` (each chain's assignments in order, chains interleaved).
        tokens: `"words"` (`c = b ;`, four tokens per assignment, `? c 7` per question) or `"pairs"` (`c=b`, one
            token per assignment, `?c 7` per question).
        queries: `"last"` (the last variable of distinct chains) or `"any"` (any variable, chains may repeat).
        train_examples, eval_examples: rows of the `train` split, and generated for each of `validation` and
            `test` (different seeds; repeats of a training example or of one held out before are left out).
    """

    num_chains: int = 6
    num_queries: int = 2
    max_hops: int = 4
    num_names: int = 26
    num_values: int = 10
    order: str = "shuffled"
    tokens: str = "words"
    queries: str = "last"
    min_hops: int = 1
    train_examples: int = 50_000
    eval_examples: int = 1_000

    def __post_init__(self):
        for field in ("num_chains", "num_queries", "max_hops", "min_hops", "num_values", "train_examples", "eval_examples"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"multihop {field} must be a positive integer, got {value!r}")
        if self.min_hops > self.max_hops:
            raise ValueError(f"multihop min_hops ({self.min_hops}) must not exceed max_hops ({self.max_hops})")
        if self.queries == "last" and self.num_queries > self.num_chains:
            raise ValueError(
                f"multihop num_queries ({self.num_queries}) must not exceed num_chains ({self.num_chains}) with "
                f"queries='last' (each chain is asked once)"
            )
        if self.num_names < self.num_chains * self.max_hops:
            raise ValueError(
                f"multihop num_names ({self.num_names}) must be at least num_chains * max_hops "
                f"({self.num_chains * self.max_hops}): every variable of an example has its own name"
            )
        for field, choices in (("order", ("shuffled", "in_order")), ("tokens", ("words", "pairs")), ("queries", ("last", "any"))):
            if getattr(self, field) not in choices:
                raise ValueError(f"multihop {field} must be {' or '.join(map(repr, choices))}, got {getattr(self, field)!r}")
        check_split_sizes("multihop", self.train_examples, self.eval_examples, self.sequence_length)

    @classmethod
    def from_string(cls, text: str | None) -> MultiHopConfig:
        """`"num_chains=6,num_queries=2,max_hops=4,order=in_order"` (None or empty: the defaults); errors name the key."""
        if not text:
            return cls()
        types = {field.name: field.type for field in dataclasses.fields(cls)}
        values = read_task_settings("multihop", text, list(types))
        return cls(**{key: value if types[key] == "str" else _integer(key, value) for key, value in values.items()})

    @property
    def sequence_length(self) -> int:
        """Tokens per (padded) example: per assignment 4 (`b = a ;`) or 1 (`b=a`), per query 3 (`? b 7`) or 2."""
        per_assignment, per_query = (1, 2) if self.tokens == "pairs" else (4, 3)
        return per_assignment * self.num_chains * self.max_hops + per_query * self.num_queries


def _integer(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"multihop {key} must be an integer, got {value!r}") from None


def multihop_tokenizer(config: MultiHopConfig) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the task's symbols, digits and variable names (one token each)."""
    names = [f"v{index}" for index in range(config.num_names)]
    digits = [str(value) for value in range(config.num_values)]
    vocabulary = [*SYMBOLS, *digits, *names]
    if config.tokens == "pairs":
        vocabulary += [f"{name}={value}" for name in names for value in (*digits, *names) if value != name]
        vocabulary += [f"?{name}" for name in names]
    return word_level_tokenizer(vocabulary, pad="<pad>")


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


def multihop_example(config: MultiHopConfig, rng: random.Random) -> tuple[list[str], list[bool], list[int]]:
    """One example as words, a flag per word saying whether it is an answer, and each answer's number of hops."""
    lengths = [rng.randint(config.min_hops, config.max_hops) for _ in range(config.num_chains)]
    names = iter(f"v{name}" for name in rng.sample(range(config.num_names), sum(lengths)))
    chains = [[next(names) for _ in range(length)] for length in lengths]
    values = [str(rng.randrange(config.num_values)) for _ in chains]
    assignments = [
        [[chain[0], "=", value, ";"]] + [[chain[i], "=", chain[i - 1], ";"] for i in range(1, len(chain))]
        for chain, value in zip(chains, values)
    ]
    if config.order == "shuffled":
        ordered = [assignment for chain in assignments for assignment in chain]
        rng.shuffle(ordered)
    else:  # chains interleaved, each in order
        ordered, pending = [], [list(chain) for chain in assignments]
        while pending:
            chain = rng.choice(pending)
            ordered.append(chain.pop(0))
            pending = [rest for rest in pending if rest]
    pairs = config.tokens == "pairs"
    if pairs:  # `c = b ;` as the one token `c=b`
        words = ["".join(assignment[:3]) for assignment in ordered]
    else:
        words = [word for assignment in ordered for word in assignment]
    is_answer = [False] * len(words)
    hops = []
    if config.queries == "last":
        asked = [(index, len(chains[index]) - 1) for index in rng.sample(range(config.num_chains), config.num_queries)]
    else:
        variables = [(index, position) for index, chain in enumerate(chains) for position in range(len(chain))]
        asked = [rng.choice(variables) for _ in range(config.num_queries)]
    for index, position in asked:
        question = [f"?{chains[index][position]}"] if pairs else ["?", chains[index][position]]
        words += [*question, values[index]]
        is_answer += [False] * len(question) + [True]
        hops.append(position + 1)
    return words, is_answer, hops


def multihop_datasets(config: MultiHopConfig, seed: int = 0) -> datasets.DatasetDict:
    """`train`, `validation` and `test` splits (each from its own seed) of tokenized examples, right-padded to `config.sequence_length`: `input_ids`,
    `attention_mask`, `labels` (the answers, -100 elsewhere) and `answer_hops`."""
    tokenizer = multihop_tokenizer(config)
    vocabulary = tokenizer.get_vocab()

    def rows(count: int, split_seed: int) -> dict[str, list]:
        rng = random.Random(split_seed)
        columns = {"input_ids": [], "attention_mask": [], "labels": [], "answer_hops": []}
        for _ in range(count):
            words, is_answer, hops = multihop_example(config, rng)
            ids = [vocabulary[word] for word in words]
            padding = config.sequence_length - len(ids)
            columns["input_ids"].append(ids + [tokenizer.pad_token_id] * padding)
            columns["attention_mask"].append([1] * len(ids) + [0] * padding)
            labels = [token if answer else IGNORE_INDEX for token, answer in zip(ids, is_answer)]
            columns["labels"].append(labels + [IGNORE_INDEX] * padding)
            columns["answer_hops"].append(hops)
        return columns

    return generated_splits(rows, config.train_examples, config.eval_examples, seed)
