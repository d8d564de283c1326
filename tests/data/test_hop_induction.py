"""k-hop induction: every label is the letter k hops away as the task defines it, aligned for the causal loss, and
run_clm.py trains and scores it by hop count."""

import json

import pytest
from helpers.scripts import tiny_task_flags
from huggingface_hub import ModelCard

from hf_layertie.data.generated_tasks import IGNORE_INDEX
from hf_layertie.data.hop_induction import (
    NO_ANSWER,
    HopInductionConfig,
    hop_induction_datasets,
    hop_induction_tokenizer,
)
from hf_layertie.language_modeling import CAUSAL_LM, MASKED_LM, run


def hop(letters: list[str], position: int, hops: int) -> str:
    """The definition, one hop at a time: to the letter after the last earlier occurrence of the current letter."""
    for _ in range(hops):
        earlier = [index for index in range(position) if letters[index] == letters[position]]
        if not earlier:
            return NO_ANSWER
        position = earlier[-1] + 1
    return letters[position]


def test_every_label_is_the_letter_its_hop_count_reaches_one_position_later():
    config = HopInductionConfig(length=40, num_letters=3, min_hops=0, max_hops=5, train_examples=200, eval_examples=10)
    tokenizer = hop_induction_tokenizer(config)
    seen_hops = set()
    for row in hop_induction_datasets(config, seed=4)["train"]:
        tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
        hops, letters = int(tokens[0].removeprefix("k")), tokens[1:-1]
        seen_hops.add(hops)
        assert len(letters) == 40 and all(a != b for a, b in zip(letters, letters[1:]))  # no letter twice in a row
        # The causal loss compares the logits at position p with the label at p + 1: letter i sits at p = i + 1.
        labels = tokenizer.convert_ids_to_tokens(row["labels"][2:])
        assert row["labels"][:2] == [IGNORE_INDEX, IGNORE_INDEX]
        assert labels == [hop(letters, index, hops) for index in range(40)]
        assert row["answer_hops"] == [hops] * 40
    assert seen_hops == set(range(6))


def test_the_splits_are_seeded_and_differ():
    config = HopInductionConfig(length=16, train_examples=20, eval_examples=20)
    first, again, other = (hop_induction_datasets(config, seed=seed) for seed in (1, 1, 2))
    assert first["train"]["input_ids"] == again["train"]["input_ids"]
    assert first["train"]["input_ids"] != other["train"]["input_ids"]
    assert first["train"]["input_ids"] != first["validation"]["input_ids"] != first["test"]["input_ids"]


def test_no_evaluation_example_is_a_training_example_or_counted_twice(caplog):
    """A small task's example space repeats examples across and within splits: the repeats are held out of
    evaluation (a training example, one earlier in the split, a validation example in test)."""
    config = HopInductionConfig(length=10, max_hops=2, train_examples=5000, eval_examples=200)
    with caplog.at_level("WARNING"):
        splits = hop_induction_datasets(config, seed=0)
    trained = {tuple(ids) for ids in splits["train"]["input_ids"]}
    held_out = {split: [tuple(ids) for ids in splits[split]["input_ids"]] for split in ("validation", "test")}
    for split, examples in held_out.items():
        assert 0 < len(examples) < 200 and not trained & set(examples) and len(set(examples)) == len(examples)
        assert f"of the 200 generated {split} examples repeat a training example or one held out before" in caplog.text
    assert not set(held_out["validation"]) & set(held_out["test"])
    small = HopInductionConfig(length=6, num_letters=3, max_hops=2, train_examples=50, eval_examples=50)
    evaluated = hop_induction_datasets(small, seed=0)["validation"]["input_ids"]
    assert len({tuple(ids) for ids in evaluated}) == len(evaluated)
    tiny = HopInductionConfig(length=2, num_letters=2, max_hops=1, train_examples=200, eval_examples=10)
    with pytest.raises(ValueError, match="every generated validation example repeats a training example or one held out before it"):
        hop_induction_datasets(tiny, seed=0)


@pytest.mark.parametrize(
    "text, message",
    [
        ("hops=3", "hop_induction setting 'hops' is unknown"),
        ("max_hops=two", "hop_induction max_hops must be an integer, got 'two'"),
        ("min_hops=4,max_hops=2", r"min_hops \(4\) must not exceed max_hops \(2\)"),
        ("num_letters=1", "num_letters must be at least 2"),
        ("length=0", "hop_induction length must be a positive integer, got 0"),
        ("min_hops=-1", "hop_induction min_hops must be a non-negative integer, got -1"),
    ],
)
def test_bad_task_settings_name_the_setting(text, message):
    with pytest.raises(ValueError, match=message):
        HopInductionConfig.from_string(text)


def test_run_clm_trains_and_scores_the_task_by_hop_count(tmp_path, capsys):
    flags = tiny_task_flags(
        tmp_path, "hop_induction", "length=24,max_hops=2,train_examples=64,eval_examples=16",
        "--do_eval", "--per_device_train_batch_size", "8", "--disable_tqdm", "true", max_steps=3,
    )  # fmt: skip
    metrics = run(CAUSAL_LM, flags)
    assert {"eval_accuracy", "eval_mean_accuracy", "eval_accuracy_hops_1", "eval_accuracy_hops_2"} <= metrics.keys()
    assert "eval_bigram_loss" not in metrics  # a count bigram of the task's tokens means nothing
    assert json.loads((tmp_path / "all_results.json").read_text())["eval_mean_accuracy"] == metrics["eval_mean_accuracy"]
    assert "multi-hop accuracy (16 evaluation examples)" in capsys.readouterr().out
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.datasets is None  # a generated task is no Hub dataset
    every_setting = "length=24,num_letters=4,min_hops=1,max_hops=2,train_examples=64,eval_examples=16"
    assert f"on hop_induction ({every_setting})" in card.text
    train_only = [*flags[:6], "--output_dir", str(tmp_path / "trained"), "--do_train", "--max_steps", "1", "--report_to", "none"]
    trained_alone = run(CAUSAL_LM, train_only)
    assert "train_loss" in trained_alone and "eval_mean_accuracy" not in trained_alone  # no accuracy to report, no crash
    with pytest.raises(ValueError, match=r"--dataset_name hop_induction .* needs 26 positions; the model has 16"):
        overrides = "n_layer=1,n_embd=16,n_head=2,n_positions=16"
        run(CAUSAL_LM, [*flags[:4], "--config_overrides", overrides, "--output_dir", str(tmp_path / "short"), "--do_train"])
    with pytest.raises(ValueError, match="--dataset_name hop_induction is a causal language modeling task"):
        run(MASKED_LM, ["--dataset_name", "hop_induction", "--output_dir", str(tmp_path / "mlm"), "--do_train"])

