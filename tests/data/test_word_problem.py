"""The group word problem: every label is the running product of the elements so far, as the group multiplies them,
aligned for the causal loss; the groups are the groups; run_clm.py trains and scores it by position."""

import itertools
import math

import numpy as np
import pytest
from helpers.scripts import tiny_task_flags

from hf_layertie.data.generated_tasks import IGNORE_INDEX
from hf_layertie.data.word_problem import (
    WordProblemConfig,
    elements,
    is_solvable,
    multiplication_table,
    word_problem_datasets,
    word_problem_tokenizer,
)
from hf_layertie.language_modeling import CAUSAL_LM, run


def compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """First a, then b: the definition the task uses."""
    return tuple(b[a[x]] for x in range(len(a)))


@pytest.mark.parametrize("group, order", [("S3", 6), ("S4", 24), ("A4", 12), ("A5", 60), ("S5", 120), ("Z7", 7)])
def test_each_group_has_its_order_and_is_closed_with_an_identity_and_inverses(group, order):
    members = elements(group)
    assert len(set(members)) == order and members[0] == tuple(range(len(members[0])))  # the identity first
    table = multiplication_table(group)
    assert sorted(table[0]) == list(range(order)) and all(sorted(row) == list(range(order)) for row in table)  # a Latin square
    assert all((table[a] == 0).any() for a in range(order))  # every element has an inverse
    triples = np.random.default_rng(0).integers(0, order, size=(200, 3))
    assert all(table[table[a, b], c] == table[a, table[b, c]] for a, b, c in triples)  # associative


@pytest.mark.parametrize("group", ["S3", "A4", "S4", "A5", "Z12"])
def test_the_table_is_the_composition_of_the_permutations(group):
    members = elements(group)
    table = multiplication_table(group)
    index = {member: position for position, member in enumerate(members)}
    assert all(table[a, b] == index[compose(members[a], members[b])] for a in range(len(members)) for b in range(len(members)))


def derived_series_ends_trivial(table: np.ndarray) -> bool:
    """Solvability from the table alone: take the subgroup the commutators generate until it stops shrinking;
    the group is solvable when that ends at the identity."""
    inverse = np.argmin(table, axis=1)  # the identity is element 0: a b = 0 where b is a's inverse
    subgroup = set(range(len(table)))
    while len(subgroup) > 1:
        generated = {int(table[table[a, b], table[inverse[a], inverse[b]]]) for a in subgroup for b in subgroup}
        while True:  # closed under products: the subgroup the commutators generate
            grown = generated | {int(table[a, b]) for a in generated for b in generated}
            if grown == generated:
                break
            generated = grown
        if generated == subgroup:
            return False
        subgroup = generated
    return True


@pytest.mark.parametrize("group", ["S2", "S3", "A3", "S4", "A4", "A5", "S5", "Z6"])
def test_a_group_is_solvable_as_its_derived_series_says(group):
    assert is_solvable(group) == derived_series_ends_trivial(multiplication_table(group))


def test_a5_is_not_abelian_and_z_n_is():
    a5, z = multiplication_table("A5"), multiplication_table("Z6")
    assert (a5 != a5.T).any() and (z == z.T).all()
    assert math.factorial(5) // 2 == len(a5)


def test_every_label_is_the_product_of_the_prefix_one_position_later():
    config = WordProblemConfig(group="S4", length=12, train_examples=100, eval_examples=10)
    tokenizer = word_problem_tokenizer(config)
    members = elements("S4")
    for row in word_problem_datasets(config, seed=3)["train"]:
        tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
        assert tokens[0] == "<s>" and tokens[-1] == "<pad>" and len(tokens) == config.sequence_length
        word = [members[int(token.removeprefix("e"))] for token in tokens[1:-1]]
        assert row["labels"][:2] == [IGNORE_INDEX, IGNORE_INDEX]
        # The causal loss compares the logits at position p with the label at p + 1: element t sits at p = t + 1.
        products = [members[int(token.removeprefix("e"))] for token in tokenizer.convert_ids_to_tokens(row["labels"][2:])]
        assert products == list(itertools.accumulate(word, compose))
        assert row["answer_hops"] == list(range(1, 13))


def test_the_splits_are_seeded_and_differ():
    config = WordProblemConfig(group="A5", length=8, train_examples=50, eval_examples=20)
    first, again, other = (word_problem_datasets(config, seed=seed) for seed in (0, 0, 1))
    assert first["train"]["input_ids"] == again["train"]["input_ids"] != other["train"]["input_ids"]
    assert first["validation"]["input_ids"] != first["test"]["input_ids"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("group=B5", r"word_problem group must be S<n> \(n from 2 to 6\), A<n> \(n from 3 to 6\) or Z<n>.*got 'B5'"),
        ("group=S7", r"got 'S7'"),
        ("group=A2", r"got 'A2'"),
        ("group=Z721", r"got 'Z721'"),
        ("length=0", r"word_problem length must be a positive integer, got 0"),
        ("length=x", r"word_problem length must be an integer, got 'x'"),
        ("size=3", r"word_problem setting 'size' is unknown; settings: eval_examples, group, length, train_examples"),
    ],
)
def test_bad_task_settings_name_the_setting(text, message):
    with pytest.raises(ValueError, match=message):
        WordProblemConfig.from_string(text)


def test_run_clm_trains_and_scores_the_task_by_position(tmp_path, capsys):
    flags = tiny_task_flags(
        tmp_path, "word_problem", "group=S3,length=6,train_examples=64,eval_examples=16",
        "--do_eval", "--per_device_train_batch_size", "8", "--disable_tqdm", "true", max_steps=3, n_positions=16,
    )  # fmt: skip
    metrics = run(CAUSAL_LM, flags)
    assert {"eval_accuracy", "eval_mean_accuracy", *(f"eval_accuracy_hops_{t}" for t in range(1, 7))} <= metrics.keys()
    assert all(0 <= metrics[f"eval_accuracy_hops_{t}"] <= 1 for t in range(1, 7))
    printed = capsys.readouterr().out
    assert "word_problem accuracy (16 evaluation examples)" in printed and "mean over positions" in printed
