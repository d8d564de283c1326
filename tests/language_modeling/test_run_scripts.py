"""run_clm.py, run_mlm.py and run_lambada.py end to end on tiny settings, and their errors on bad input."""

import csv
import importlib
import json
import math
import re
import shutil

import datasets
import pytest
import torch
from helpers.scripts import TINY_BERT, TINY_GPT2, play_lines, tiny_flags
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.utils import is_flash_attn_2_available

from hf_layertie.data import LAMBADA_TEST_FILE
from hf_layertie.lambada.run import run_lambada
from hf_layertie.language_modeling import CAUSAL_LM, MASKED_LM, run
from hf_layertie.toolkit import load_text_datasets, tokenize_and_group

# The fast tier (`python -m pytest -m "not e2e and not slow"`) leaves these out: the scripts run end to end.
pytestmark = pytest.mark.e2e


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
    assert "on train.txt (local file)" in card and "datasets:" not in card  # a file is no Hub dataset


def test_a_model_whose_context_the_sample_prompt_fills_finishes_without_a_sample(tmp_path, text_files, capsys):
    overrides = "n_layer=2,n_embd=16,n_head=2,n_positions=16"
    metrics = run(CAUSAL_LM, tiny_flags(tmp_path, text_files, overrides, "--block_size", "16", "--max_steps", "2"))
    assert math.isfinite(metrics["eval_loss"])
    assert "[model]  (none: the prompt fills the model's context)" in capsys.readouterr().out


def test_run_mlm_trains_a_tied_bert_with_the_embedded_vocabulary(tmp_path, text_files):
    metrics = run(MASKED_LM, tiny_flags(tmp_path, text_files, TINY_BERT, "--tying_strategy", "static:cycle:2"))
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    model = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert model.tying_map.to_list() == [0, 1, 0]
    assert model.config.vocab_size == 2048  # shakespeare-wordpiece, shipped with the package


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
        "tying_strategy": "static:all",
        "report_to": [],
    }
    (tmp_path / "args.json").write_text(json.dumps(settings))
    run(CAUSAL_LM, [str(tmp_path / "args.json")])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tying_map"] == [0, 0, 0]


def test_a_crashed_run_resumes_from_its_last_complete_checkpoint(tmp_path, text_files):
    flags = tiny_flags(tmp_path, text_files, TINY_GPT2, "--save_steps", "2", "--do_eval", "false")
    run(CAUSAL_LM, flags)
    uninterrupted_history = (tmp_path / "tying_history.jsonl").read_text()
    uninterrupted_weights = (tmp_path / "model.safetensors").read_bytes()
    # A crash during the save at step 6, after one at step 4 that was cut short: neither checkpoint is complete,
    # and the final model and state never got written.
    (tmp_path / "checkpoint-6" / "tying_state.pt").unlink()
    (tmp_path / "checkpoint-4" / "trainer_state.json").unlink()
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "trainer_state.json").unlink()
    run(CAUSAL_LM, flags)  # the same command again skips both and resumes from checkpoint-2
    assert (tmp_path / "tying_history.jsonl").read_text() == uninterrupted_history
    assert (tmp_path / "model.safetensors").read_bytes() == uninterrupted_weights


def test_a_tying_run_refuses_to_continue_the_checkpoints_of_a_conventional_run(tmp_path, text_files):
    common = ("--save_steps", "2", "--do_eval", "false")
    run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, *common, "--tying_strategy", "none", "--max_steps", "4"))
    tying = tiny_flags(tmp_path, text_files, TINY_GPT2, *common)
    (tmp_path / "trainer_state.json").unlink()  # as if it had crashed after its step-4 checkpoint
    kept = {path: path.read_bytes() for path in tmp_path.glob("checkpoint-*/*") if path.is_file()}
    with pytest.raises(ValueError, match="tying_strategy='none' there, 'dlt' here"):
        run(CAUSAL_LM, tying)
    assert {path: path.read_bytes() for path in tmp_path.glob("checkpoint-*/*") if path.is_file()} == kept


def test_a_run_trained_by_epochs_is_finished_unless_more_epochs_are_asked_for(tmp_path):
    from hf_layertie.trainer import finished_training_step

    state = {"global_step": 10, "max_steps": 10, "num_train_epochs": 1, "epoch": 1.0}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    assert finished_training_step(tmp_path, max_steps=-1, num_train_epochs=1) == 10
    assert finished_training_step(tmp_path, max_steps=-1, num_train_epochs=3) is None  # resumed to train on
    assert finished_training_step(tmp_path, max_steps=12) is None and finished_training_step(tmp_path, max_steps=8) == 10
    # Half an epoch (the Trainer saves num_train_epochs rounded up): one epoch asked for is more.
    (tmp_path / "trainer_state.json").write_text(json.dumps(state | {"epoch": 0.5}))
    assert finished_training_step(tmp_path, max_steps=-1, num_train_epochs=1) is None
    assert finished_training_step(tmp_path, max_steps=-1, num_train_epochs=0.5) == 10


def test_a_checkpoint_to_resume_is_refused_naming_what_is_wrong(tmp_path):
    from hf_layertie.trainer import checkpoint_to_resume

    with pytest.raises(ValueError, match=r"--resume_from_checkpoint .*checkpoint-9: no such folder"):
        checkpoint_to_resume(tmp_path, str(tmp_path / "checkpoint-9"))
    (tmp_path / "checkpoint-6").mkdir()
    with pytest.raises(ValueError, match=r"--resume_from_checkpoint .*checkpoint-6 is incomplete: it has no config.json"):
        checkpoint_to_resume(tmp_path, str(tmp_path / "checkpoint-6"))
    for name in ("config.json", "trainer_state.json", "model.safetensors"):  # a plain Trainer's checkpoint
        (tmp_path / "checkpoint-6" / name).write_text("{}")
    with pytest.raises(ValueError, match=r"checkpoint-6 has no tying_state.pt: its save was interrupted, or a plain Trainer saved it"):
        checkpoint_to_resume(tmp_path, str(tmp_path / "checkpoint-6"))


def test_a_finished_run_run_again_says_so_and_changes_nothing(tmp_path, text_files, caplog):
    flags = tiny_flags(tmp_path, text_files, TINY_GPT2)
    first = run(CAUSAL_LM, flags)
    files = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    with caplog.at_level("WARNING"):
        again = run(CAUSAL_LM, flags)
    assert "already finished at step 6: nothing is trained or changed" in caplog.text
    assert again == first
    checkpoint = str(tmp_path / "checkpoint-2")  # named explicitly: said to be unused, nothing trained again
    with caplog.at_level("WARNING"):
        assert run(CAUSAL_LM, [*flags, "--resume_from_checkpoint", checkpoint]) == first
    assert f"--resume_from_checkpoint {checkpoint} is not used (no step is trained again" in caplog.text
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == files
    # Its final weights lost, it is finished from its last checkpoint, still not from the one named: no checkpoint
    # after that one is written again.
    (tmp_path / "model.safetensors").unlink()
    saved_at = {path: path.stat().st_mtime_ns for path in tmp_path.glob("checkpoint-*/trainer_state.json")}
    assert run(CAUSAL_LM, [*flags, "--resume_from_checkpoint", checkpoint])["eval_loss"] == first["eval_loss"]
    assert {path: path.stat().st_mtime_ns for path in tmp_path.glob("checkpoint-*/trainer_state.json")} == saved_at
    assert (tmp_path / "model.safetensors").read_bytes() == files[tmp_path / "model.safetensors"]


def test_a_finished_run_run_again_with_do_eval_evaluates_its_model_training_no_step(tmp_path, text_files, caplog):
    run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, "--do_eval", "false"))
    weights = (tmp_path / "model.safetensors").read_bytes()
    with caplog.at_level("WARNING"):
        metrics = run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2))
    assert "finished at step 6 without an evaluation (--do_eval): producing them, training no step" in caplog.text
    assert "eval_loss" in metrics and json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 6
    assert (tmp_path / "model.safetensors").read_bytes() == weights


def test_a_finished_run_asked_to_evaluate_other_data_evaluates_it_rather_than_answering_the_saved_evaluation(
    tmp_path, text_files, caplog
):
    first = run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2))
    weights = (tmp_path / "model.safetensors").read_bytes()
    fewer = tiny_flags(tmp_path, text_files, TINY_GPT2, "--max_eval_samples", "3")
    with caplog.at_level("WARNING"):
        metrics = run(CAUSAL_LM, fewer)
    assert "without an evaluation with --max_eval_samples 3 (the saved one had other data settings)" in caplog.text
    assert (first["eval_samples"], metrics["eval_samples"]) == (8, 3)
    assert json.loads((tmp_path / "all_results.json").read_text())["eval_samples"] == 3
    assert (tmp_path / "model.safetensors").read_bytes() == weights
    caplog.clear()
    with caplog.at_level("WARNING"):  # the same command again: its evaluation is the saved one
        assert run(CAUSAL_LM, fewer) == metrics
    assert "nothing is trained or changed" in caplog.text
    (tmp_path / "eval_settings.json").unlink()  # a folder saved before the settings were: its data is unknown
    with caplog.at_level("WARNING"):
        run(CAUSAL_LM, fewer)
    assert "an evaluation recording its data settings" in caplog.text and (tmp_path / "eval_settings.json").is_file()


def test_more_steps_for_a_run_without_checkpoints_are_refused_leaving_it_untouched(tmp_path, text_files):
    """Its optimizer state is in checkpoints only: training would start again from scratch over its model."""
    run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, "--save_strategy", "no", "--do_eval", "false"))
    files = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    longer = tiny_flags(tmp_path, text_files, TINY_GPT2, "--save_strategy", "no", "--do_eval", "false", "--max_steps", "8")
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path))} holds a run trained to step 6, and no checkpoint-N to continue it from"):
        run(CAUSAL_LM, longer)
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == files


def test_training_a_run_further_drops_the_evaluation_of_its_earlier_model(tmp_path, text_files, caplog):
    run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, "--save_steps", "2"))
    assert "eval_loss" in json.loads((tmp_path / "all_results.json").read_text())
    run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, "--save_steps", "2", "--max_steps", "8", "--do_eval", "false"))
    assert not (tmp_path / "eval_results.json").exists()
    assert not any(key.startswith("eval_") for key in json.loads((tmp_path / "all_results.json").read_text()))
    with caplog.at_level("WARNING"):  # asked again with --do_eval, the step-8 model is evaluated, not step 6's reported
        metrics = run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, "--save_steps", "2", "--max_steps", "8"))
    assert "finished at step 8 without an evaluation (--do_eval): producing them" in caplog.text and "eval_loss" in metrics


def test_an_evaluation_into_a_trained_run_s_own_folder_keeps_its_training_card_and_metrics(tmp_path, text_files, caplog):
    run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2))
    card = (tmp_path / "README.md").read_text()
    assert "eval_bigram_loss" in json.loads((tmp_path / "all_results.json").read_text())
    evaluation = [
        "--model_name_or_path", str(tmp_path), "--output_dir", str(tmp_path), "--do_eval", "--block_size", "32",
        "--validation_file", str(text_files / "validation.txt"), "--max_eval_samples", "4",
        "--report_to", "none", "--disable_tqdm", "true",
    ]  # fmt: skip
    with caplog.at_level("WARNING"):
        metrics = run(CAUSAL_LM, evaluation)
    assert "holds a trained run: its model card is kept" in caplog.text
    assert (tmp_path / "README.md").read_text() == card and "learning_rate" in card
    saved = json.loads((tmp_path / "all_results.json").read_text())
    assert saved["eval_loss"] == metrics["eval_loss"] and saved["eval_samples"] == 4 and "train_runtime" in saved
    assert "eval_bigram_loss" not in saved  # the earlier evaluation's, on other blocks: not mixed with this one


def test_the_count_baseline_counts_the_training_blocks_kept_and_scores_those_evaluated(tmp_path, text_files):
    """Beside a model trained on the first --max_train_samples blocks and evaluated on --max_eval_samples, the bigram
    is counted on the blocks kept for training and scored on those evaluated, not on the whole splits."""
    from hf_layertie.language_modeling.run import _text_data_and_model, parse_arguments
    from hf_layertie.toolkit.baselines import bigram_loss

    flags = tiny_flags(tmp_path, text_files, TINY_GPT2, "--max_train_samples", "12", "--max_steps", "2")
    metrics = run(CAUSAL_LM, flags)
    model_args, data_args, _ = parse_arguments(CAUSAL_LM, flags)
    grouped, tokenizer, _ = _text_data_and_model(CAUSAL_LM, model_args, data_args)
    assert len(grouped["train"]) > 12 and len(grouped["validation"]) > 8
    counted, scored = grouped["train"]["input_ids"][:12], grouped["validation"]["input_ids"][:8]
    assert metrics["eval_bigram_loss"] == pytest.approx(bigram_loss(counted, scored, len(tokenizer)))
    # Evaluating the trained model alone with the same data flags counts the same blocks.
    evaluation = [
        "--model_name_or_path", str(tmp_path), "--output_dir", str(tmp_path / "evaluated"), "--do_eval",
        "--train_file", str(text_files / "train.txt"), "--validation_file", str(text_files / "validation.txt"),
        "--block_size", "32", "--max_train_samples", "12", "--max_eval_samples", "8", "--report_to", "none",
    ]  # fmt: skip
    assert run(CAUSAL_LM, evaluation)["eval_bigram_loss"] == metrics["eval_bigram_loss"]


def test_a_masked_model_s_held_out_loss_is_the_mean_over_the_tokens_it_scored_and_repeats_exactly(tmp_path, text_files):
    """run_mlm.py masks the evaluation blocks once, as many tokens in each: the loss printed is the mean loss of
    those tokens however the blocks fall into batches (3, 3 and 1 here), and evaluating the model again, in another
    process state, scores the same tokens. The unigram beside it is scored on them too."""
    from hf_layertie.language_modeling.run import _text_data_and_model, parse_arguments
    from hf_layertie.toolkit import mask_evaluation_blocks
    from hf_layertie.toolkit.baselines import unigram_loss

    evaluation = ["--max_eval_samples", "7", "--per_device_eval_batch_size", "3"]
    flags = tiny_flags(tmp_path / "run", text_files, TINY_BERT, "--tying_strategy", "static:cycle:2", *evaluation)
    metrics = run(MASKED_LM, flags)
    again = run(MASKED_LM, [*evaluation, "--model_name_or_path", str(tmp_path / "run"), "--do_eval",
                            "--validation_file", str(text_files / "validation.txt"), "--block_size", "32",
                            "--output_dir", str(tmp_path / "again"), "--report_to", "none"])  # fmt: skip
    assert again["eval_loss"] == metrics["eval_loss"]

    model_args, data_args, training_args = parse_arguments(MASKED_LM, flags)
    grouped, tokenizer, _ = _text_data_and_model(MASKED_LM, model_args, data_args)
    scored = mask_evaluation_blocks(grouped["validation"].select(range(7)), tokenizer, 0.15, training_args.seed)
    labels = torch.tensor(scored["labels"])
    assert len(set((labels != -100).sum(dim=1).tolist())) == 1  # as many scored tokens in every block
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "run").eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(scored["input_ids"]), attention_mask=torch.tensor(scored["attention_mask"])).logits
    by_hand = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100).item()
    assert metrics["eval_loss"] == pytest.approx(by_hand, rel=1e-5)
    train = grouped["train"]["input_ids"]
    assert metrics["eval_unigram_loss"] == pytest.approx(unigram_loss(train, [row[row != -100] for row in labels], len(tokenizer), tokenizer.all_special_ids))


def test_a_masked_model_s_held_out_reward_is_the_mean_over_tokens_masked_once(tmp_path, text_files, trainer_inputs):
    """run_mlm.py masks the held-out reward's blocks once, as many tokens in each, as it masks evaluation's: the
    reward is the mean loss of those tokens, though the trainer scores them in micro-batches (4 and 2 here)."""
    held_out = ("--reward_source", "held_out", "--reward_batch_size", "6")
    run(MASKED_LM, tiny_flags(tmp_path, text_files, TINY_BERT, *held_out))
    reward = trainer_inputs["reward_dataset"]
    labels = torch.tensor(reward["labels"])
    assert len(reward) == 6 and len(set((labels != -100).sum(dim=1).tolist())) == 1
    trainer = trainer_inputs["trainer"]
    model = trainer.model.eval()
    with torch.no_grad():
        by_hand = model(input_ids=torch.tensor(reward["input_ids"]), attention_mask=torch.tensor(reward["attention_mask"]), labels=labels).loss.item()
    assert trainer.held_out_loss() == pytest.approx(by_hand, rel=1e-5)


def test_evaluation_masks_as_many_tokens_in_every_block_and_leaves_out_a_block_with_too_few(caplog):
    """The count is the masking share of the median block's maskable tokens; a block of special tokens only would
    otherwise have one scored (a special token, which no masked model is asked for) or pull every block's count
    down."""
    import datasets

    from hf_layertie.data import load_embedded_tokenizer
    from hf_layertie.toolkit import mask_evaluation_blocks

    tokenizer = load_embedded_tokenizer("shakespeare-wordpiece")
    text = tokenizer("to be or not to be that is the question whether tis nobler in the mind " * 2, add_special_tokens=False)["input_ids"]
    special = [tokenizer.cls_token_id, tokenizer.sep_token_id] * 10
    rows = [text[:20], text[3:23], special, text[1:21]]
    with caplog.at_level("WARNING"):
        masked = mask_evaluation_blocks(datasets.Dataset.from_dict({"input_ids": rows}), tokenizer, 0.25, seed=0)
    assert "1 of 4 evaluation blocks hold fewer than 5 maskable tokens" in caplog.text
    labels = torch.tensor(masked["labels"])
    assert len(masked) == 3 and (labels != -100).sum(dim=1).tolist() == [5, 5, 5]
    assert not torch.isin(labels[labels != -100], torch.tensor(tokenizer.all_special_ids)).any()
    again = mask_evaluation_blocks(datasets.Dataset.from_dict({"input_ids": rows}), tokenizer, 0.25, seed=0)
    assert again["input_ids"] == masked["input_ids"] and again["labels"] == masked["labels"]


def test_the_unigram_baseline_is_the_hand_computed_loss_on_the_tokens_a_masked_model_is_asked_for():
    """Special tokens ([CLS] 0, [SEP] 1) are never masked: neither counted nor scored, and given no mass."""
    from hf_layertie.toolkit.baselines import unigram_loss

    train, evaluated = [[0, 2, 2, 1], [0, 3, 1]], [[0, 2, 4, 1]]
    # add-one counts of the non-special tokens 2, 3, 4 of a vocabulary of 5: 3, 2, 1 (of 6)
    assert unigram_loss(train, evaluated, 5, special_ids=[0, 1]) == pytest.approx(-(math.log(3 / 6) + math.log(1 / 6)) / 2)


def test_a_kill_after_the_last_checkpoint_finishes_from_it_without_a_step_more(tmp_path, text_files):
    flags = tiny_flags(
        tmp_path, text_files, TINY_GPT2, "--save_steps", "2", "--do_eval", "false",
        "--lr_scheduler_type", "constant", "--warmup_steps", "0",
    )  # fmt: skip
    run(CAUSAL_LM, flags)
    uninterrupted = {name: (tmp_path / name).read_bytes() for name in ("tying_history.jsonl", "model.safetensors")}
    # Killed after checkpoint-6 (at max_steps) was saved, before the final model and state were.
    for name in ("trainer_state.json", "model.safetensors", "tying_state.pt", "all_results.json"):
        (tmp_path / name).unlink()
    run(CAUSAL_LM, flags)
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 6
    assert not (tmp_path / "checkpoint-7").exists()
    assert {name: (tmp_path / name).read_bytes() for name in uninterrupted} == uninterrupted
    assert len((tmp_path / "tying_history.jsonl").read_text().splitlines()) == 3


def test_a_finished_run_that_lost_its_results_produces_them_from_the_saved_model(tmp_path, text_files, caplog):
    flags = tiny_flags(tmp_path, text_files, TINY_GPT2)
    first = run(CAUSAL_LM, flags)
    weights = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "all_results.json").unlink()  # killed during the final evaluation
    (tmp_path / "README.md").unlink()
    with caplog.at_level("WARNING"):
        again = run(CAUSAL_LM, flags)
    assert "finished at step 6 without all_results.json, README.md: producing them" in caplog.text
    assert again["eval_loss"] == pytest.approx(first["eval_loss"], abs=1e-6)
    assert json.loads((tmp_path / "all_results.json").read_text())["eval_loss"] == pytest.approx(first["eval_loss"], abs=1e-6)
    assert "eval_loss" in (tmp_path / "README.md").read_text()
    assert (tmp_path / "model.safetensors").read_bytes() == weights
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 6


# --- the embedded default, and flags on top of it --------------------------------------------------

ON_TOP = ["--max_steps", "2", "--max_eval_samples", "4", "--report_to", "none", "--sample_max_new_tokens", "8"]


def test_flags_given_without_data_or_model_apply_on_top_of_the_embedded_default(tmp_path, capsys):
    metrics = run(CAUSAL_LM, [*ON_TOP, "--output_dir", str(tmp_path), "--config_overrides", "n_layer=2"])
    config = json.loads((tmp_path / "config.json").read_text())
    default = json.loads(CAUSAL_LM.default_arguments.read_text())
    assert (config["n_layer"], config["n_embd"], config["n_positions"]) == (2, 96, 64)  # overrides merged, user's last
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 2
    assert {"eval_loss", "eval_bigram_loss", "train_runtime"} <= set(metrics)
    assert len((tmp_path / "tying_history.jsonl").read_text().splitlines()) == 1  # tying_interval 4 from the default
    assert default["tying_interval"] == 4 and default["tying_strategy"] == "dlt"
    printed = capsys.readouterr().out
    assert "count bigram" in printed and "[model]" in printed  # the comparison and a sample


def test_a_run_with_nothing_to_do_stops_with_a_clear_error(tmp_path, text_files):
    with pytest.raises(ValueError, match="Nothing to do: pass --do_train, --do_eval or both"):
        run(CAUSAL_LM, [*ON_TOP, "--output_dir", str(tmp_path), "--do_train", "false", "--do_eval", "false", "--eval_strategy", "no"])
    with pytest.raises(ValueError, match="Nothing to do"):
        run(CAUSAL_LM, ["--train_file", str(text_files / "train.txt"), "--output_dir", str(tmp_path)])  # no default here


def test_help_explains_the_default_and_the_flags_on_top(capsys):
    with pytest.raises(SystemExit):
        run(CAUSAL_LM, ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "With no data or model arguments" in text and "every flag given overrides it" in text
    assert "--tying_strategy" in text and "--max_distinct_blocks" in text
    assert "The batch size per device for training. (default: 16)" in text  # the embedded default's, not 8


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
        (lambda d, t: ["--train_file", str(t / "train.txt"), "--max_train_samples", "0"], ValueError, "--max_train_samples must be a positive integer, got 0"),
        (lambda d, t: ["--train_file", str(t / "train.txt"), "--model_type", "tied_gpt5"], ValueError, "--model_type 'tied_gpt5' is not a tied model type"),
        (lambda d, t: ["--train_file", str(t / "train.txt"), "--model_type", "tied_bert"], ValueError, "--model_type 'tied_bert' does not fit run_clm.py"),
        (
            lambda d, t: ["--train_file", write(d / "numbers.csv", "a,b\n1,2\n3,4\n")],
            ValueError,
            r"The text column 'a' of the train split of --train_file/--validation_file .*numbers.csv holds Value\('int64'\), not text",
        ),
        (
            lambda d, t: ["--train_file", write(d / "rows.jsonl", '{"text": "a line"}\n{"text": null}\n{"text": "more"}\n')],
            ValueError,
            r"Row 1 \(counted from 0\) of the train split of --train_file/--validation_file .*rows.jsonl holds None in the text column 'text': every row needs a string",
        ),
        (
            lambda d, t: ["--train_file", write(d / "ints.jsonl", '{"text": 5}\n{"text": 6}\n')],
            ValueError,
            r"The text column 'text' of the train split of .*ints.jsonl holds Value\('int64'\), not text",
        ),
    ],
)
def test_bad_input_to_run_clm_gives_one_clear_error(tmp_path, text_files, make_flags, error, message):
    flags = [*make_flags(tmp_path, text_files), "--config_overrides", TINY_GPT2, "--output_dir", str(tmp_path / "o"), "--do_train"]
    with pytest.raises(error, match=message):
        run(CAUSAL_LM, flags)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ("garbage", r"--config_overrides 'garbage': .*expected comma-separated key=value pairs of TiedGPT2Config fields"),
        ("n_layer=abc", r"--config_overrides 'n_layer=abc': invalid literal for int\(\)"),
        ("n_layer=2,wings=3", r"--config_overrides 'n_layer=2,wings=3': key wings isn't in the original config dict"),
        ("n_layer=2,tying_map=0 0", r"--config_overrides 'n_layer=2,tying_map=0 0': tying_map cannot be given among key=value overrides"),
        ("tie_init=3", r"--config_overrides 'tie_init=3': .*tie_init must be one of"),
        ("n_inner=3", r"--config_overrides 'n_inner=3': You can only update int, float, bool or string values"),
    ],
)
def test_bad_config_overrides_are_named(tmp_path, text_files, overrides, message):
    flags = ["--train_file", str(text_files / "train.txt"), "--config_overrides", overrides, "--output_dir", str(tmp_path), "--do_train"]
    with pytest.raises(ValueError, match=message):
        run(CAUSAL_LM, flags)


def test_a_csv_without_a_text_column_trains_on_its_first_column_and_says_so(tmp_path, caplog):
    with open(tmp_path / "train.csv", "w", newline="") as file:
        csv.writer(file).writerows([("content", "number"), *((line, index) for index, line in enumerate(play_lines(300).splitlines()))])
    train = str(tmp_path / "train.csv")
    flags = ["--train_file", train, "--config_overrides", TINY_GPT2, "--block_size", "32", "--output_dir", str(tmp_path / "o"),
             "--do_train", "--max_steps", "1", "--tying_strategy", "none", "--report_to", "none"]  # fmt: skip
    with caplog.at_level("WARNING"):
        run(CAUSAL_LM, flags)
    assert "no 'text' column; training on its first column, 'content'" in caplog.text


def test_a_truncated_checkpoint_is_named(tmp_path, clm_run):
    checkpoint, _ = clm_run
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(Exception, match=rf"--model_name_or_path {broken}: could not load {weights}"):
        run(CAUSAL_LM, ["--model_name_or_path", str(broken), "--output_dir", str(tmp_path / "o"), "--do_eval", "--max_eval_samples", "2"])


def test_a_json_argument_of_the_wrong_type_is_named(tmp_path):
    (tmp_path / "args.json").write_text(json.dumps({"output_dir": str(tmp_path), "do_train": True, "tying_interval": "5"}))
    with pytest.raises(ValueError, match="tying_interval must be an integer >= 1 .*got '5'"):
        run(CAUSAL_LM, [str(tmp_path / "args.json")])


def test_masked_lm_with_a_tokenizer_without_mask_or_pad_token_is_rejected_naming_its_flag(tmp_path, text_files, clm_run):
    from hf_layertie.data import embedded_tokenizer_dir

    gpt2 = str(embedded_tokenizer_dir("gpt2"))
    with pytest.raises(ValueError, match=rf"--tokenizer_name {re.escape(gpt2)}: masked language modeling needs a tokenizer with a mask token and a pad token"):
        run(MASKED_LM, tiny_flags(tmp_path, text_files, TINY_BERT, "--tokenizer_name", gpt2))
    # A causal checkpoint given to run_mlm.py: its tokenizer comes from --model_name_or_path, which the error names.
    checkpoint, _ = clm_run
    flags = tiny_flags(tmp_path, text_files, TINY_BERT)
    at = flags.index("--config_overrides")
    del flags[at : at + 2]
    with pytest.raises(ValueError, match=rf"--model_name_or_path {re.escape(str(checkpoint))}: masked language modeling needs"):
        run(MASKED_LM, [*flags, "--model_name_or_path", str(checkpoint)])


@pytest.fixture
def loaded_models(monkeypatch):
    """The models the workflow builds, kept (its `load_model` wrapped) to be looked at once they trained."""
    workflow = importlib.import_module("hf_layertie.language_modeling.run")  # the module, not the `run` it exports
    load_model, models = workflow.load_model, []

    def load_and_keep(*args, **kwargs):
        models.append(load_model(*args, **kwargs))
        return models[-1]

    monkeypatch.setattr(workflow, "load_model", load_and_keep)
    return models


@pytest.mark.parametrize(
    "flag, value, dtype, attention",
    [
        ("--torch_dtype", "float32", torch.float32, "sdpa"),
        ("--torch_dtype", "bfloat16", torch.bfloat16, "sdpa"),
        ("--attn_implementation", "eager", torch.float32, "eager"),
        ("--attn_implementation", "sdpa", torch.float32, "sdpa"),
    ],
)
def test_a_model_from_scratch_trains_under_the_dtype_and_attention_asked(
    tmp_path, text_files, loaded_models, flag, value, dtype, attention
):
    metrics = run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, "--max_steps", "10", flag, value))
    (model,) = loaded_models
    assert {parameter.dtype for parameter in model.parameters()} == {dtype}
    assert model.config._attn_implementation == attention
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 10
    assert math.isfinite(metrics["eval_loss"])
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == str(dtype).removeprefix("torch.")


@pytest.mark.parametrize(
    "flags, dtype, attention",
    [
        (["--torch_dtype", "auto"], torch.bfloat16, "sdpa"),  # the checkpoint's own
        (["--torch_dtype", "float32", "--attn_implementation", "eager"], torch.float32, "eager"),
    ],
)
def test_a_checkpoint_loads_under_the_dtype_and_attention_asked(tmp_path, text_files, clm_run, loaded_models, flags, dtype, attention):
    checkpoint, _ = clm_run
    AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    evaluation = ["--validation_file", str(text_files / "validation.txt"), "--block_size", "32", "--max_eval_samples", "2"]
    common = ["--model_name_or_path", str(tmp_path / "bf16"), "--tokenizer_name", str(checkpoint), *evaluation]
    run(CAUSAL_LM, [*common, "--output_dir", str(tmp_path / "o"), "--do_eval", "--report_to", "none", *flags])
    (model,) = loaded_models
    assert {parameter.dtype for parameter in model.parameters()} == {dtype}
    assert model.config._attn_implementation == attention


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--torch_dtype", "float64", "--torch_dtype 'float64': expected one of auto, bfloat16, float16, float32"),
        ("--attn_implementation", "flash", "--attn_implementation 'flash': expected one of eager, sdpa, flash_attention_2"),
        pytest.param(
            "--attn_implementation",
            "flash_attention_2",
            "--attn_implementation flash_attention_2 needs the flash-attn package",
            marks=pytest.mark.skipif(is_flash_attn_2_available(), reason="flash-attn can run here"),
        ),
    ],
)
def test_a_dtype_or_attention_that_cannot_load_is_refused_naming_its_flag(tmp_path, text_files, loaded_models, flag, value, message):
    with pytest.raises(ValueError, match=message):
        run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, flag, value))
    assert loaded_models == []  # refused with the arguments, before any model is built


def test_run_mlm_trains_under_the_dtype_and_attention_asked(tmp_path, text_files, loaded_models):
    flags = ("--max_steps", "10", "--torch_dtype", "bfloat16", "--attn_implementation", "eager")
    metrics = run(MASKED_LM, tiny_flags(tmp_path, text_files, TINY_BERT, "--tying_strategy", "static:cycle:2", *flags))
    (model,) = loaded_models
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == "eager"
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 10
    assert math.isfinite(metrics["eval_loss"])


# --- --streaming: the data as an IterableDataset -------------------------------------------------


@pytest.fixture
def trainer_inputs(monkeypatch):
    """What the workflow hands `TyingTrainer` (its datasets and tokenizer; its constructor wrapped), and the trainer."""
    workflow = importlib.import_module("hf_layertie.language_modeling.run")
    seen = {}

    class Recording(workflow.TyingTrainer):
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)
            super().__init__(*args, **kwargs)
            seen["trainer"] = self

    monkeypatch.setattr(workflow, "TyingTrainer", Recording)
    return seen


def without(flags, *names):
    """`flags` without each flag in `names` and its value."""
    flags = list(flags)
    for name in names:
        index = flags.index(name)
        del flags[index : index + 2]
    return flags


def test_streaming_trains_on_a_stream_for_max_steps_and_evaluates_max_eval_samples_blocks(tmp_path, text_files, trainer_inputs):
    held_out = ("--reward_source", "held_out", "--reward_batch_size", "4")
    metrics = run(CAUSAL_LM, tiny_flags(tmp_path, text_files, TINY_GPT2, "--streaming", "--max_steps", "10", *held_out))

    assert isinstance(trainer_inputs["train_dataset"], datasets.IterableDataset)
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 10
    assert metrics["eval_samples"] == 8 and math.isfinite(metrics["eval_loss"])
    assert "train_samples" not in metrics and "eval_bigram_loss" not in metrics  # both need the whole training split
    # The stream is cut into the blocks the loaded data is: the reward takes the first 4 training blocks (training
    # skips them) and evaluation the first 8 validation blocks.
    raw = load_text_datasets(train_file=str(text_files / "train.txt"), validation_file=str(text_files / "validation.txt"))
    blocks = tokenize_and_group(raw, trainer_inputs["processing_class"], "text", 32)
    assert trainer_inputs["reward_dataset"]["input_ids"] == blocks["train"]["input_ids"][:4]
    assert next(iter(trainer_inputs["train_dataset"]))["input_ids"] == blocks["train"]["input_ids"][4]
    assert trainer_inputs["eval_dataset"]["input_ids"] == blocks["validation"]["input_ids"][:8]


def test_streaming_mlm_holds_out_a_validation_stream_from_a_train_file_alone(tmp_path, text_files, trainer_inputs):
    flags = tiny_flags(tmp_path, text_files, TINY_BERT, "--tying_strategy", "static:cycle:2", "--streaming", "--max_steps", "10")
    metrics = run(MASKED_LM, without(flags, "--validation_file", "--max_eval_samples") + ["--max_eval_samples", "4"])

    assert isinstance(trainer_inputs["train_dataset"], datasets.IterableDataset)
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 10
    assert metrics["eval_samples"] == 4 and math.isfinite(metrics["eval_loss"])
    assert AutoModelForMaskedLM.from_pretrained(tmp_path).tying_map.to_list() == [0, 1, 0]


def test_a_local_dataset_without_train_or_validation_split_is_refused_naming_its_splits(tmp_path):
    (tmp_path / "corpus").mkdir()
    write(tmp_path / "corpus" / "test.txt", "only a test split\n")
    with pytest.raises(ValueError, match=rf"--dataset_name {re.escape(str(tmp_path / 'corpus'))} has the splits test: it needs a 'train' split"):
        load_text_datasets(dataset_name=str(tmp_path / "corpus"))


def test_a_block_size_beyond_the_model_s_context_is_refused_before_any_data_is_read(tmp_path):
    flags = ["--dataset_name", str(tmp_path / "never-read"), "--config_overrides", TINY_GPT2, "--block_size", "64"]
    with pytest.raises(ValueError, match=r"--block_size 64 is larger than the model's context of 32 positions"):
        run(CAUSAL_LM, [*flags, "--output_dir", str(tmp_path / "run"), "--do_train", "--report_to", "none"])


def test_training_on_a_dataset_with_a_validation_split_alone_is_refused_naming_it(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write(corpus / "validation.txt", play_lines(40))
    flags = ["--dataset_name", str(corpus), "--config_overrides", TINY_GPT2, "--block_size", "32", "--report_to", "none"]
    with pytest.raises(ValueError, match=rf"--dataset_name {re.escape(str(corpus))} has no 'train' split to train on"):
        run(CAUSAL_LM, [*flags, "--output_dir", str(tmp_path / "trained"), "--do_train"])


@pytest.mark.parametrize("source", ["train_file", "embedded"])
def test_a_stream_without_a_validation_split_holds_out_the_rows_below_the_percentage_modulo_100(tmp_path, source):
    if source == "train_file":
        path = write(tmp_path / "rows.txt", "\n".join(f"row {index}" for index in range(250)))
        loaded, streamed = (load_text_datasets(train_file=path, streaming=streaming) for streaming in (False, True))
        rows = [row["text"] for row in loaded["train"]] + [row["text"] for row in loaded["validation"]]
        assert [row["text"] for row in streamed["validation"]] == [row for index, row in enumerate(rows) if index % 100 < 5]
        assert [row["text"] for row in streamed["train"]] == [row for index, row in enumerate(rows) if index % 100 >= 5]
    else:  # the shipped corpus has its own validation plays
        loaded, streamed = load_text_datasets(), load_text_datasets(streaming=True)
        assert isinstance(streamed, datasets.IterableDatasetDict) and set(streamed) == {"train", "validation"}
        for split in ("train", "validation"):
            assert [row["text"] for row in streamed[split].take(20)] == loaded[split]["text"][:20]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda flags: without(flags, "--max_steps"), "--streaming needs --max_steps to train"),
        (lambda flags: without(flags, "--max_eval_samples"), "--streaming needs --max_eval_samples to evaluate"),
        (
            lambda flags: ["--dataset_name", "hop_induction", "--output_dir", flags[flags.index("--output_dir") + 1], "--do_train",
                           "--max_steps", "2", "--streaming"],
            "--streaming reads text data as a stream; --dataset_name hop_induction is generated in memory",
        ),
    ],
    ids=["no_max_steps", "no_max_eval_samples", "generated_task"],
)
def test_streaming_without_what_a_stream_needs_is_refused_naming_the_flag(tmp_path, text_files, loaded_models, change, message):
    with pytest.raises(ValueError, match=message):
        run(CAUSAL_LM, change(tiny_flags(tmp_path, text_files, TINY_GPT2, "--streaming")))
    assert loaded_models == []  # refused with the arguments, before any model is built


@pytest.fixture(scope="module")
def lambada_file(tmp_path_factory):
    lines = LAMBADA_TEST_FILE.read_text(encoding="utf-8").splitlines()[:40]
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
    card = (tmp_path / "README.md").read_text()
    assert "This card records no training: the results below were measured with hf-layertie on lambada." in card
    assert "fine-tuned" not in card and "learning_rate" not in card and str(checkpoint) not in card.split("---")[1]


def test_run_lambada_fine_tunes_and_scores_only_the_held_out_passages(tmp_path, clm_run, lambada_file):
    checkpoint, _ = clm_run
    flags = [
        "--model_name_or_path", str(checkpoint), "--lambada_file", str(lambada_file), "--do_train", "--do_eval",
        "--output_dir", str(tmp_path), "--report_to", "none", "--max_steps", "4", "--tying_interval", "2",
        "--per_device_train_batch_size", "4", "--block_size", "32", "--eval_fraction", "0.25",
    ]  # fmt: skip
    metrics = run_lambada(flags)
    assert metrics["eval_lambada_examples"] == 10  # the last quarter of 40 passages
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "tying_map.png").is_file()
    weights = (tmp_path / "model.safetensors").read_bytes()
    again = run_lambada(flags)  # the same command again: the run is finished, nothing is trained
    assert again["eval_lambada_accuracy"] == metrics["eval_lambada_accuracy"]
    assert (tmp_path / "model.safetensors").read_bytes() == weights
    # Asked nothing its saved results lack, a finished run returns them and writes nothing (run_lifecycle's rule,
    # as run_clm.py's); under other tying settings it is refused, naming them.
    files = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    training_only = [flag for flag in flags if flag != "--do_eval"]
    assert run_lambada(training_only) == json.loads((tmp_path / "all_results.json").read_text())
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == files
    interval = training_only.index("--tying_interval") + 1
    with pytest.raises(ValueError, match="tying_interval=2 there, 4 here"):
        run_lambada([*training_only[:interval], "4", *training_only[interval + 1 :]])


def test_run_lambada_names_the_malformed_line(tmp_path, clm_run):
    checkpoint, _ = clm_run
    bad = write(tmp_path / "bad.jsonl", '{"text": "a passage that ends well"}\n{"txt": "oops"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: expected a JSON object with a \"text\" key"):
        run_lambada(["--model_name_or_path", str(checkpoint), "--lambada_file", bad, "--do_eval", "--output_dir", str(tmp_path)])
