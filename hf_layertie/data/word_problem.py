"""The group word problem: the running product of a sequence of group elements, with a label at every position.

A sequence of elements g_1 ... g_T of a finite group G follows a start token; the target at position t is the
product g_1 g_2 ... g_t. For a non-solvable group (`A5`, `S5`) the problem is NC1-complete (Barrington, 1989), so a
transformer of constant depth cannot solve it at every length unless TC0 = NC1 (Merrill & Sabharwal, 2023); for a
solvable one (`Z<n>`, `S3`, `S4`, `A4`) shortcuts of constant depth exist (Liu et al., 2023, "Transformers learn
shortcuts to automata"). 2026 work reports that at matched depth and parameters untied models fail to learn A5 while
looped ones do. It is the second depth task beside k-hop induction (`hf_layertie.data.hop_induction`).

Elements are permutations of n points (`Z<n>` as the rotations of n points), numbered in lexicographic order of
their images; each is one token. The examples use the generated tasks' columns
(`hf_layertie.data.generated_tasks`): `labels` hold each position's product (shifted for the causal loss: the model
predicts the product through position t at position t) and `answer_hops` the prefix length t, so `evaluate_hop_task`
and the `hop_accuracy` metric report accuracy per position. Everything is generated from a seed: no download.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

import datasets
import numpy as np
from transformers import PreTrainedTokenizerFast

from .generated_tasks import IGNORE_INDEX, check_split_sizes, generated_splits, read_task_settings, word_level_tokenizer

PAD, START = "<pad>", "<s>"
# `group` values: symmetric S<n> and alternating A<n> of up to 6 points (S6: 720 elements), cyclic Z<n> of up to 720
# elements: a table of 720 x 720 products, one token per element.
GROUP = re.compile(r"^([SAZ])([1-9]\d*)$")
LARGEST_DEGREE, LARGEST_CYCLE = 6, 720


@dataclass(frozen=True)
class WordProblemConfig:
    """The task's settings; `from_string("group=A5,length=16")` reads `--dataset_config_name`.

    Args:
        group: `S<n>` (symmetric, all permutations of n points, n 2-6), `A<n>` (alternating, the even ones, n 3-6)
            or `Z<n>` (cyclic, the n rotations, n 2-720).
        length: group elements per example (the products a model must keep up with).
        train_examples, eval_examples: rows of the `train` split, and generated for each of `validation` and `test`.
    """

    group: str = "A5"
    length: int = 16
    train_examples: int = 50_000
    eval_examples: int = 1_000

    def __post_init__(self):
        elements(self.group)  # refuses an unknown group by name
        for name in ("length", "train_examples", "eval_examples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"word_problem {name} must be a positive integer, got {value!r}")
        check_split_sizes("word_problem", self.train_examples, self.eval_examples, self.sequence_length)

    @classmethod
    def from_string(cls, text: str | None) -> WordProblemConfig:
        """`"group=A5,length=16"` (None or empty: the defaults); errors name the key."""
        return cls(**read_task_settings("word_problem", text, cls, text_fields=("group",))) if text else cls()

    @property
    def sequence_length(self) -> int:
        """The start token, the elements, and one position more that holds the last product."""
        return self.length + 2


def _group_kind(group) -> tuple[str, int]:
    """`("S", 5)` for `"S5"`, ...; a `ValueError` naming the setting for a group this task does not offer (A2 has one
    element: nothing to learn)."""
    match = GROUP.match(group) if isinstance(group, str) else None
    kind, degree = (match.group(1), int(match.group(2))) if match else ("", 0)
    largest = LARGEST_CYCLE if kind == "Z" else LARGEST_DEGREE
    if not match or not (3 if kind == "A" else 2) <= degree <= largest:
        raise ValueError(
            f"word_problem group must be S<n> (n from 2 to {LARGEST_DEGREE}), A<n> (n from 3 to {LARGEST_DEGREE}) or "
            f"Z<n> (n from 2 to {LARGEST_CYCLE}), e.g. A5, S4 or Z60; got {group!r}"
        )
    return kind, degree


@lru_cache(maxsize=None)
def elements(group: str) -> tuple[tuple[int, ...], ...]:
    """The group's elements as permutations (tuples of images of 0..n-1), in lexicographic order; the identity is
    the first (`Z<n>`: the rotations, by 0, 1, ... places)."""
    kind, degree = _group_kind(group)
    if kind == "Z":
        return tuple(tuple((point + shift) % degree for point in range(degree)) for shift in range(degree))
    permutations = itertools.permutations(range(degree))
    return tuple(p for p in permutations if kind == "S" or _is_even(p))


def is_solvable(group: str) -> bool:
    """Whether `group` is solvable: every cyclic group, and the symmetric and alternating groups of up to 4 points
    (S<n> and A<n> from 5 points on are not). Which kind a word problem is decides what depth it needs."""
    kind, degree = _group_kind(group)
    return kind == "Z" or degree <= 4


def _is_even(permutation: tuple[int, ...]) -> bool:
    inversions = sum(1 for i, j in itertools.combinations(range(len(permutation)), 2) if permutation[i] > permutation[j])
    return inversions % 2 == 0


@lru_cache(maxsize=None)
def multiplication_table(group: str) -> np.ndarray:
    """`table[a, b]`: the index of the product of elements a and b (first a, then b: `(a b)(x) = b(a(x))`)."""
    kind, degree = _group_kind(group)
    if kind == "Z":  # rotating by a places, then by b, rotates by a + b
        shifts = np.arange(degree)
        return (shifts[:, None] + shifts[None, :]) % degree
    members = np.array(elements(group))
    # A permutation's code, its images read as digits in base n: sorted as the elements are (lexicographically).
    powers = degree ** np.arange(degree - 1, -1, -1)
    codes = members @ powers
    table = np.empty((len(members), len(members)), dtype=np.int64)
    for a, first in enumerate(members):
        table[a] = np.searchsorted(codes, members[:, first] @ powers)  # row b: b(first(x)) for every x
    return table


def running_products(words: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Per row of `words` (examples x length, element indices), the product of each prefix."""
    products = np.empty_like(words)
    products[:, 0] = words[:, 0]
    for position in range(1, words.shape[1]):
        products[:, position] = table[products[:, position - 1], words[:, position]]
    return products


def word_problem_tokenizer(config: WordProblemConfig) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: padding, the start token and one token per element (`e0`, `e1`, ...)."""
    count = len(elements(config.group))
    return word_level_tokenizer([PAD, START, *(f"e{index}" for index in range(count))], pad=PAD)


def word_problem_datasets(config: WordProblemConfig, seed: int = 0) -> datasets.DatasetDict:
    """`train`, `validation` and `test` splits: `input_ids` (the start token, the elements, padding),
    `attention_mask`, `labels` (each prefix's product one position later, for the causal shift) and `answer_hops`
    (each label's prefix length)."""
    table = multiplication_table(config.group)
    vocabulary = word_problem_tokenizer(config).get_vocab()
    element_ids = np.array([vocabulary[f"e{index}"] for index in range(len(table))])

    def rows(count: int, split_seed: int) -> dict[str, list]:
        rng = np.random.default_rng(split_seed)
        words = rng.integers(0, len(table), size=(count, config.length))
        products = running_products(words, table)
        input_ids = np.concatenate(
            [np.full((count, 1), vocabulary[START]), element_ids[words], np.full((count, 1), vocabulary[PAD])], axis=1
        )
        labels = np.concatenate([np.full((count, 2), IGNORE_INDEX), element_ids[products]], axis=1)
        return {
            "input_ids": input_ids.tolist(),
            "attention_mask": np.ones_like(input_ids).tolist(),
            "labels": labels.tolist(),
            "answer_hops": np.tile(np.arange(1, config.length + 1), (count, 1)).tolist(),
        }

    return generated_splits(rows, config.train_examples, config.eval_examples, seed)
