"""run_clm.py, run_mlm.py and run_lambada.py end to end on tiny settings, and their errors on bad input."""

import json
import math

import pytest
import torch
from conftest import SHARED_DATA
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from hf_layertie.lambada.run import run_lambada
from hf_layertie.language_modeling import CAUSAL_LM, MASKED_LM, run

TINY_GPT2 = "n_layer=3,n_embd=16,n_head=2,n_positions=32"
TINY_BERT = "num_hidden_layers=3,hidden_size=16,num_attention_heads=2,intermediate_size=32,max_position_embeddings=32"


def play_lines(count, start=0):
    lines = (SHARED_DATA / "shakespeare" / "hamlet_gut.txt").read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines[start : start + count] if line.strip())


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    (folder / "train.txt").write_text(play_lines(400))
    (folder / "validation.txt").write_text(play_lines(100, start=2000))
    return folder


def tiny_flags(output_dir, text_files, overrides, *extra):
    return [
        "--train_file", str(text_files / "train.txt"),
        "--validation_file", str(text_files / "validation.txt"),
        "--config_overrides", overrides,
        "--block_size", "32",
        "--output_dir", str(output_dir),
        "--do_train", "--do_eval",
        "--max_steps", "6",
        "--tying_interval", "2",
        "--reward_batch_size", "4",
        "--per_device_train_batch_size", "4",
        "--max_eval_samples", "8",
        "--report_to", "none",
        "--disable_tqdm", "true",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory, text_files):
    output_dir = tmp_path_factory.mktemp("clm")
    metrics = run(CAUSAL_LM, tiny_flags(output_dir, text_files, TINY_GPT2))
    return output_dir, metrics


def test_run_clm_trains_evaluates_and_leaves_a_loadable_checkpoint_card_and_plot(clm_run):
    output_dir, metrics = clm_run
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    for name in ("model.safetensors", "config.json", "README.md", "tying_map.png", "tying_history.jsonl", "all_results.json"):
        assert (output_dir / name).is_file(), name
    saved_map = json.loads((output_dir / "config.json").read_text())["tying_map"]
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    assert model.tying_map.to_list() == (saved_map if saved_map is not None else [0, 1, 2])
    card = (output_dir / "README.md").read_text()
    assert model.tying_map.render() in card and "tying_map.png" in card


def test_run_mlm_trains_a_tied_bert_with_the_embedded_vocabulary(tmp_path, text_files):
    metrics = run(MASKED_LM, tiny_flags(tmp_path, text_files, TINY_BERT, "--tying_strategy", "static:cycle:2"))
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    model = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert model.tying_map.to_list() == [0, 1, 0]
    assert model.config.vocab_size == 30522  # bert-base-uncased, shipped with the package


def test_arguments_can_come_from_a_json_file(tmp_path, text_files):
    settings = {
        "train_file": str(text_files / "train.txt"),
        "validation_file": str(text_files / "validation.txt"),
        "config_overrides": TINY_GPT2,
        "block_size": 32,
        "output_dir": str(tmp_path / "out"),
        "do_train": True,
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "reward_batch_size": 4,
        "tying_strategy": "static:all",
        "report_to": [],
    }
    (tmp_path / "args.json").write_text(json.dumps(settings))
    run(CAUSAL_LM, [str(tmp_path / "args.json")])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tying_map"] == [0, 0, 0]


def test_a_crashed_run_resumes_from_its_last_checkpoint(tmp_path, text_files):
    import shutil

    flags = tiny_flags(tmp_path, text_files, TINY_GPT2, "--save_steps", "4", "--do_eval", "false")
    run(CAUSAL_LM, flags)
    uninterrupted_history = (tmp_path / "tying_history.jsonl").read_text()
    uninterrupted_weights = (tmp_path / "model.safetensors").read_bytes()
    # A crash after step 4: the final checkpoint and model never got written.
    shutil.rmtree(tmp_path / "checkpoint-6")
    (tmp_path / "model.safetensors").unlink()
    run(CAUSAL_LM, flags)  # the same command again picks up checkpoint-4
    assert (tmp_path / "tying_history.jsonl").read_text() == uninterrupted_history
    assert (tmp_path / "model.safetensors").read_bytes() == uninterrupted_weights


def write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "make_flags, error, message",
    [
        (lambda d, t: ["--train_file", str(d / "missing.txt")], FileNotFoundError, r"--train_file .*missing.txt: no such file"),
        (lambda d, t: ["--train_file", write(d / "empty.txt", "")], ValueError, r"--train_file .*empty.txt: the file is empty"),
        (lambda d, t: ["--train_file", write(d / "data.xml", "<a/>")], ValueError, r"--train_file .*data.xml: expected a .txt"),
        (
            lambda d, t: ["--train_file", write(d / "data.csv", "content\nhello there\nsecond row\nthird\n"), "--text_column_name", "text"],
            ValueError,
            r"--text_column_name 'text' is not a column of the data; its columns are \['content'\]",
        ),
        (
            lambda d, t: ["--train_file", str(t / "train.txt"), "--block_size", "64"],
            ValueError,
            "--block_size 64 is larger than the model's context of 32 positions",
        ),
        (lambda d, t: ["--validation_file", str(t / "validation.txt")], ValueError, "--validation_file needs --train_file"),
    ],
)
def test_bad_input_to_run_clm_gives_one_clear_error(tmp_path, text_files, make_flags, error, message):
    flags = [*make_flags(tmp_path, text_files), "--config_overrides", TINY_GPT2, "--output_dir", str(tmp_path / "o"), "--do_train"]
    with pytest.raises(error, match=message):
        run(CAUSAL_LM, flags)


def test_masked_lm_with_a_tokenizer_without_mask_or_pad_token_is_rejected(tmp_path, text_files):
    from hf_layertie.data import embedded_tokenizer_dir

    flags = tiny_flags(tmp_path, text_files, TINY_BERT, "--tokenizer_name", str(embedded_tokenizer_dir("gpt2")))
    with pytest.raises(ValueError, match="masked language modeling needs a tokenizer with a mask token and a pad token"):
        run(MASKED_LM, flags)


@pytest.fixture(scope="module")
def lambada_file(tmp_path_factory):
    lines = (SHARED_DATA / "lambada" / "lambada_test.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    path = tmp_path_factory.mktemp("lambada") / "lambada_small.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_lambada_evaluates_a_tied_checkpoint_into_metrics_and_card(tmp_path, clm_run, lambada_file):
    checkpoint, _ = clm_run
    flags = ["--model_name_or_path", str(checkpoint), "--lambada_file", str(lambada_file), "--do_eval"]
    metrics = run_lambada([*flags, "--output_dir", str(tmp_path), "--report_to", "none", "--max_eval_passages", "12"])
    assert metrics["eval_lambada_examples"] == 12
    assert 0.0 <= metrics["eval_lambada_accuracy"] <= 1.0 and metrics["eval_lambada_perplexity"] > 1.0
    assert json.loads((tmp_path / "eval_results.json").read_text())["eval_lambada_accuracy"] == metrics["eval_lambada_accuracy"]
    assert "lambada" in (tmp_path / "README.md").read_text().lower()


def test_run_lambada_fine_tunes_and_scores_only_the_held_out_passages(tmp_path, clm_run, lambada_file):
    checkpoint, _ = clm_run
    flags = [
        "--model_name_or_path", str(checkpoint), "--lambada_file", str(lambada_file), "--do_train", "--do_eval",
        "--output_dir", str(tmp_path), "--report_to", "none", "--max_steps", "4", "--tying_interval", "2",
        "--reward_batch_size", "4", "--per_device_train_batch_size", "4", "--block_size", "32", "--eval_fraction", "0.25",
    ]  # fmt: skip
    metrics = run_lambada(flags)
    assert metrics["eval_lambada_examples"] == 10  # the last quarter of 40 passages
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "tying_map.png").is_file()


def test_run_lambada_names_the_malformed_line(tmp_path, clm_run):
    checkpoint, _ = clm_run
    bad = write(tmp_path / "bad.jsonl", '{"text": "a passage that ends well"}\n{"txt": "oops"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: expected a JSON object with a \"text\" key"):
        run_lambada(["--model_name_or_path", str(checkpoint), "--lambada_file", bad, "--do_eval", "--output_dir", str(tmp_path)])
