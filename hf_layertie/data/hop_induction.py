"""k-hop induction (Sanford, Hsu & Telgarsky, 2024): a task whose depth need is known, with a label at every position.

A sequence of letters (no letter twice in a row) follows a hop-count token `k`. From position `i`, one hop goes to
the letter right after the last earlier occurrence of the letter at `i`; the target at `i` is the letter reached
after `k` hops, or `~` when a hop finds no earlier occurrence. One hop is an induction head (two attention steps);
a transformer of depth L is shown to reach about 2^(L-2) hops, and small ones trained on it stay near chance beyond
that (the authors' measured errors, width 128: 2 blocks 0.42 at 4 hops, 4 blocks 0.015). It replaced a task of
chains of variable references, on which no small model learned a second hop (bench/README.md, "Before it: chains
of references"): here every position is supervised and every example holds many chains of hops.

The examples use the generated tasks' columns (`hf_layertie.data.generated_tasks`): `labels` hold each position's
target (shifted for the causal loss: the model predicts the target of position `i` at position `i`) and
`answer_hops` the example's `k` for each of them, so `evaluate_hop_task` and the `hop_accuracy` metric report
accuracy per hop count. Everything is generated from a seed: no download.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import datasets
import numpy as np
from transformers import PreTrainedTokenizerFast

from .generated_tasks import IGNORE_INDEX, check_split_sizes, generated_splits, read_task_settings, word_level_tokenizer

PAD, NO_ANSWER = "<pad>", "~"


@dataclass(frozen=True)
class HopInductionConfig:
    """The size of the task; `from_string("length=64,max_hops=4")` reads `--dataset_config_name`.

    Args:
        length: letters per example.
        num_letters: the alphabet (`a`, `b`, ...); the authors use 4.
        min_hops, max_hops: each example's `k` is drawn uniformly from min_hops..max_hops.
        train_examples, eval_examples: rows of the `train` split, and generated for each of `validation` and
            `test` (each split from its own seed; repeats of a training example or of one held out before are
            left out).
    """

    length: int = 64
    num_letters: int = 4
    min_hops: int = 1
    max_hops: int = 4
    train_examples: int = 50_000
    eval_examples: int = 1_000

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value, least = getattr(self, field.name), 0 if field.name == "min_hops" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                kind = "a non-negative" if least == 0 else "a positive"
                raise ValueError(f"hop_induction {field.name} must be {kind} integer, got {value!r}")
        if self.num_letters < 2:
            raise ValueError(f"hop_induction num_letters must be at least 2 (no letter repeats at once), got {self.num_letters}")
        if self.min_hops > self.max_hops:
            raise ValueError(f"hop_induction min_hops ({self.min_hops}) must not exceed max_hops ({self.max_hops})")
        check_split_sizes("hop_induction", self.train_examples, self.eval_examples, self.sequence_length)

    @classmethod
    def from_string(cls, text: str | None) -> HopInductionConfig:
        """`"length=64,max_hops=4"` (None or empty: the defaults); errors name the key."""
        return cls(**read_task_settings("hop_induction", text, cls)) if text else cls()

    @property
    def sequence_length(self) -> int:
        """The hop-count token, the letters, and one position more that holds the last target."""
        return self.length + 2


def hop_induction_tokenizer(config: HopInductionConfig) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: padding, `~`, the letters and one token per hop count (`k3`)."""
    vocabulary = [PAD, NO_ANSWER, *_letters(config), *(f"k{hops}" for hops in range(config.max_hops + 1))]
    return word_level_tokenizer(vocabulary, pad=PAD)


def _letters(config: HopInductionConfig) -> list[str]:
    return [chr(ord("a") + index) if index < 26 else f"l{index}" for index in range(config.num_letters)]


def hop_targets(letters: np.ndarray, hops: np.ndarray) -> np.ndarray:
    """Per row of `letters` (examples x positions, integers), the position reached from every position after
    `hops[row]` hops, or -1 where a hop finds no earlier occurrence."""
    rows, length = letters.shape
    previous = np.full((rows, length), -1)
    last_seen = np.full((rows, int(letters.max()) + 1), -1)
    row_index = np.arange(rows)
    for position in range(length):
        previous[:, position] = last_seen[row_index, letters[:, position]]
        last_seen[row_index, letters[:, position]] = position
    # One hop: the position after the last earlier occurrence; -1 stays -1 (a sentinel column keeps it there).
    step = np.where(previous >= 0, previous + 1, -1)
    step = np.concatenate([step, np.full((rows, 1), -1)], axis=1)  # index -1 reads this column
    reached = np.tile(np.arange(length), (rows, 1))
    for hop in range(int(hops.max())):
        active = hop < hops
        reached[active] = np.take_along_axis(step[active], reached[active], axis=1)
    return reached


def hop_induction_datasets(config: HopInductionConfig, seed: int = 0) -> datasets.DatasetDict:
    """`train`, `validation` and `test` splits (the evaluation splits up to `eval_examples` each, for choosing
    settings on one and reporting the other): `input_ids` (`k`, the letters, padding), `attention_mask`, `labels`
    (each letter's target one position later, for the causal shift) and `answer_hops` (the example's `k` per
    label)."""
    vocabulary = hop_induction_tokenizer(config).get_vocab()
    letter_ids = np.array([vocabulary[letter] for letter in _letters(config)])

    def rows(count: int, split_seed: int) -> dict[str, list]:
        rng = np.random.default_rng(split_seed)
        # No letter twice in a row: each letter moves from the previous one by 1..num_letters-1 (mod num_letters).
        moves = rng.integers(1, config.num_letters, size=(count, config.length))
        moves[:, 0] = rng.integers(0, config.num_letters, size=count)
        letters = np.cumsum(moves, axis=1) % config.num_letters
        hops = rng.integers(config.min_hops, config.max_hops + 1, size=count)
        reached = hop_targets(letters, hops)
        targets = np.where(reached >= 0, letter_ids[np.take_along_axis(letters, np.maximum(reached, 0), axis=1)], vocabulary[NO_ANSWER])
        hop_ids = np.array([vocabulary[f"k{hops}"] for hops in range(config.max_hops + 1)])[hops]
        input_ids = np.concatenate([hop_ids[:, None], letter_ids[letters], np.full((count, 1), vocabulary[PAD])], axis=1)
        labels = np.concatenate([np.full((count, 2), IGNORE_INDEX), targets], axis=1)
        return {
            "input_ids": input_ids.tolist(),
            "attention_mask": np.ones_like(input_ids).tolist(),
            "labels": labels.tolist(),
            "answer_hops": np.repeat(hops[:, None], config.length, axis=1).tolist(),
        }

    return generated_splits(rows, config.train_examples, config.eval_examples, seed)
