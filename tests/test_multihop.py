"""The multi-hop reference task: examples whose answers follow their chains, the metric, and run_clm.py on it."""

import json
import random

import pytest

from hf_layertie.data.multihop import (
    IGNORE_INDEX,
    MultiHopConfig,
    multihop_datasets,
    multihop_example,
    multihop_tokenizer,
)
from hf_layertie.language_modeling import CAUSAL_LM, MASKED_LM, run
from hf_layertie.metrics import load_metric


def resolve(words: list[str], variable: str) -> tuple[str, int]:
    """Follow `variable`'s assignments in the example's words: its digit and the number of assignments followed."""
    assignments = {}
    for start in range(0, words.index("?"), 4):
        name, equals, value, end = words[start : start + 4]
        assert (equals, end) == ("=", ";")
        assert name not in assignments  # one assignment per variable
        assignments[name] = value
    hops = 0
    while not variable.isdecimal():
        variable, hops = assignments[variable], hops + 1
    return variable, hops


@pytest.mark.parametrize("order", ["shuffled", "in_order"])
def test_every_answer_is_the_end_of_its_chain_and_its_hops_the_chain_length(order):
    config = MultiHopConfig(num_chains=5, num_queries=5, max_hops=5, order=order)
    rng = random.Random(3)
    seen_hops = set()
    for _ in range(200):
        words, is_answer, hops = multihop_example(config, rng)
        queries = words[words.index("?") :]
        assert len(queries) == 3 * config.num_queries and sum(is_answer) == config.num_queries
        for index, answer_hops in zip(range(0, len(queries), 3), hops):
            marker, variable, answer = queries[index : index + 3]
            assert marker == "?" and is_answer[words.index("?") + index + 2]
            assert resolve(words, variable) == (answer, answer_hops)
        seen_hops.update(hops)
    assert seen_hops == set(range(1, 6))


def test_in_order_keeps_each_chain_in_order_and_shuffled_does_not_always():
    def references_before_definition(order):
        config, rng, count = MultiHopConfig(num_chains=4, max_hops=6, order=order), random.Random(0), 0
        for _ in range(50):
            words, _, _ = multihop_example(config, rng)
            defined = set()
            for start in range(0, words.index("?"), 4):
                value = words[start + 2]
                count += not value.isdecimal() and value not in defined
                defined.add(words[start])
        return count

    assert references_before_definition("in_order") == 0
    assert references_before_definition("shuffled") > 0


def test_the_datasets_are_seeded_padded_and_labelled_on_the_answers_only():
    config = MultiHopConfig(num_chains=3, num_queries=2, max_hops=4, train_examples=20, eval_examples=10)
    splits, again, other = (multihop_datasets(config, seed=seed) for seed in (0, 0, 1))
    assert splits["train"]["input_ids"] == again["train"]["input_ids"] != other["train"]["input_ids"]
    assert splits["train"]["input_ids"] != splits["validation"]["input_ids"][:10] + splits["validation"]["input_ids"][:10]
    tokenizer = multihop_tokenizer(config)
    for row in splits["train"]:
        assert len(row["input_ids"]) == len(row["labels"]) == len(row["attention_mask"]) == config.sequence_length
        answers = [token for token in row["labels"] if token != IGNORE_INDEX]
        assert len(answers) == len(row["answer_hops"]) == config.num_queries
        assert all(tokenizer.convert_ids_to_tokens(token).isdecimal() for token in answers)
        length = sum(row["attention_mask"])
        assert set(row["input_ids"][length:]) <= {tokenizer.pad_token_id}
        assert tokenizer.decode(row["input_ids"][:length]).split()[-3] == "?"


@pytest.mark.parametrize(
    "text, message",
    [
        ("num_chain=3", "multihop setting 'num_chain' is unknown; settings: num_chains, num_queries, max_hops"),
        ("max_hops=0", "multihop max_hops must be a positive integer, got 0"),
        ("max_hops=two", "multihop max_hops must be an integer, got 'two'"),
        ("order=random", "multihop order must be 'shuffled' or 'in_order', got 'random'"),
        ("num_chains=9,max_hops=6", r"num_names \(26\) must be at least num_chains \* max_hops \(54\)"),
        ("num_chains=2,num_queries=3", r"num_queries \(3\) must not exceed num_chains \(2\) with queries='last'"),
        ("tokens=bytes", "multihop tokens must be 'words' or 'pairs', got 'bytes'"),
        ("queries=first", "multihop queries must be 'last' or 'any', got 'first'"),
        ("min_hops=4,max_hops=3", r"multihop min_hops \(4\) must not exceed max_hops \(3\)"),
    ],
)
def test_bad_task_settings_name_the_setting(text, message):
    with pytest.raises(ValueError, match=message):
        MultiHopConfig.from_string(text)


def test_the_metric_reports_accuracy_per_hop_count_and_their_mean():
    scores = load_metric("multihop_accuracy").compute(predictions=[4, 5, 6, 1], references=[4, 5, 7, 1], hops=[1, 2, 2, 3])
    assert scores == {"accuracy": 0.75, "mean_accuracy": pytest.approx((1 + 0.5 + 1) / 3), "accuracy_by_hops": {1: 1.0, 2: 0.5, 3: 1.0}}


@pytest.mark.slow
def test_run_clm_trains_and_scores_the_task_by_hop_count(tmp_path, capsys):
    flags = [
        "--dataset_name", "multihop", "--dataset_config_name", "num_chains=3,num_queries=3,max_hops=3,train_examples=200,eval_examples=30",
        "--config_overrides", "n_layer=3,n_embd=32,n_head=2,n_positions=64", "--output_dir", str(tmp_path),
        "--do_train", "--do_eval", "--max_steps", "6", "--tying_strategy", "dlt", "--tying_interval", "2",
        "--per_device_train_batch_size", "8", "--report_to", "none", "--disable_tqdm", "true",
    ]  # fmt: skip
    metrics = run(CAUSAL_LM, flags)
    assert {"eval_accuracy", "eval_mean_accuracy", "eval_accuracy_hops_1", "eval_accuracy_hops_3"} <= metrics.keys()
    assert "eval_bigram_loss" not in metrics  # a count bigram of the task's tokens means nothing
    assert json.loads((tmp_path / "all_results.json").read_text())["eval_mean_accuracy"] == metrics["eval_mean_accuracy"]
    assert "multi-hop accuracy (30 evaluation examples)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs 45 positions; the model has 32"):
        run(CAUSAL_LM, [*flags[:4], "--config_overrides", "n_layer=2,n_embd=16,n_head=2,n_positions=32", "--output_dir", str(tmp_path / "short"), "--do_train"])


def test_the_task_is_refused_by_run_mlm(tmp_path):
    with pytest.raises(ValueError, match="--dataset_name multihop is a causal language modeling task: train it with run_clm.py"):
        run(MASKED_LM, ["--dataset_name", "multihop", "--output_dir", str(tmp_path), "--do_train"])


def test_pair_tokens_and_questions_about_any_variable_follow_the_chains():
    config = MultiHopConfig(num_chains=4, num_queries=6, min_hops=3, max_hops=3, tokens="pairs", queries="any")
    rng, seen_hops = random.Random(5), set()
    tokenizer_vocabulary = multihop_tokenizer(config).get_vocab()
    for _ in range(100):
        words, is_answer, hops = multihop_example(config, rng)
        assert len(words) <= config.sequence_length and all(word in tokenizer_vocabulary for word in words)
        first_question = next(index for index, word in enumerate(words) if word.startswith("?"))
        assert first_question == 4 * 3  # every chain 3 long: 12 assignments, one token each
        assignments = dict(word.split("=") for word in words[:first_question])
        for index, answer_hops in zip(range(first_question, len(words), 2), hops):
            variable, answer, count = words[index][1:], words[index + 1], 0
            assert is_answer[index + 1] and not is_answer[index]
            while not variable.isdecimal():
                variable, count = assignments[variable], count + 1
            assert (variable, count) == (answer, answer_hops)
        seen_hops.update(hops)
    assert seen_hops == {1, 2, 3}
