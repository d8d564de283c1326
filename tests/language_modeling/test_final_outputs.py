"""What a run leaves behind and reports, when it is resumed, finished again, evaluated alone or run without the
optional extras: `all_results.json`, the saved model and its tokenizer."""

import json
import os
import re
import shutil
import subprocess
import sys

import datasets
import pytest
import torch
from helpers.models import GPT2
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

from hf_layertie import TyingTrainer, TyingTrainingArguments
from hf_layertie.data import LAMBADA_TEST_FILE
from hf_layertie.data.embedded import SHAKESPEARE_DIR
from hf_layertie.lambada.run import run_lambada
from hf_layertie.language_modeling import CAUSAL_LM, run

# The fast tier (`python -m pytest -m "not e2e and not slow"`) leaves these out: the scripts run end to end.
pytestmark = pytest.mark.e2e

TINY_GPT2 = "n_layer=3,n_embd=16,n_head=2,n_positions=32"
TRAINING_KEYS = {"train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos"}


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    lines = (SHAKESPEARE_DIR / "julius_caesar_gut.txt").read_text(encoding="utf-8").splitlines()
    folder = tmp_path_factory.mktemp("text")
    (folder / "train.txt").write_text("\n".join(line for line in lines[:400] if line.strip()))
    (folder / "validation.txt").write_text("\n".join(line for line in lines[2000:2100] if line.strip()))
    return folder


def data_flags(text_files, *, train=True):
    files = ["--train_file", str(text_files / "train.txt")] if train else []
    return [*files, "--validation_file", str(text_files / "validation.txt"), "--block_size", "32",
            "--max_eval_samples", "8", "--per_device_eval_batch_size", "8", "--report_to", "none",
            "--disable_tqdm", "true", "--sample_max_new_tokens", "0"]  # fmt: skip


def training_flags(output_dir, text_files, *strategy):
    """Six DLT steps (a decision every 2), a checkpoint every 2, then an evaluation; a learning rate at which the
    blocks part ways, so that tying them changes the loss."""
    strategy = strategy or ("--tying_interval", "2")
    return [*data_flags(text_files), "--config_overrides", TINY_GPT2, "--output_dir", str(output_dir), "--do_train",
            "--do_eval", "--max_steps", "6", "--save_steps", "2", "--per_device_train_batch_size", "4",
            "--learning_rate", "0.01", *strategy]  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, text_files):
    """An uninterrupted run: its folder and `all_results.json`."""
    output_dir = tmp_path_factory.mktemp("finished")
    run(CAUSAL_LM, training_flags(output_dir, text_files))
    return output_dir, json.loads((output_dir / "all_results.json").read_text())


def copy_of(finished_run, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished_run[0], folder)
    return folder


def lose(folder, *names):
    for name in names:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


FINAL_SAVE = ("model.safetensors", "trainer_state.json", "tying_state.pt", "all_results.json", "README.md")


# --- resuming a finished run ---------------------------------------------------------------------------------------


def test_a_finished_run_run_again_with_another_strategy_is_refused_not_reported(finished_run, text_files, tmp_path):
    folder = copy_of(finished_run, tmp_path)
    files = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    with pytest.raises(ValueError, match=r"tying_strategy='dlt' there, 'static:all' here.*train into a new output_dir"):
        run(CAUSAL_LM, training_flags(folder, text_files, "--tying_strategy", "static:all"))
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == files


# --- the training metrics of a resumed run ---------------------------------------------------------------------------


def test_a_run_resumed_mid_way_reports_the_whole_runs_training_loss(finished_run, text_files, tmp_path, capsys):
    uninterrupted = finished_run[1]
    folder = copy_of(finished_run, tmp_path)
    lose(folder, "checkpoint-6", *FINAL_SAVE)  # killed after checkpoint-4: it resumes from there
    capsys.readouterr()
    resumed = run(CAUSAL_LM, training_flags(folder, text_files))
    printed = capsys.readouterr()
    closing = re.search(r"\{'train_runtime': [^}]*\}", printed.out + printed.err).group()  # the line the console shows
    assert f"'train_loss': '{resumed['train_loss']:.4g}'" in closing
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-6)
    assert TRAINING_KEYS <= uninterrupted.keys()
    assert resumed.keys() == uninterrupted.keys()
    assert "epoch" in json.loads((folder / "train_results.json").read_text())  # what Trainer.log adds, kept
    assert resumed["total_flos"] == uninterrupted["total_flos"]
    assert json.loads((folder / "all_results.json").read_text()) == resumed
    log_history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    summary = next(entry for entry in reversed(log_history) if "train_runtime" in entry)  # the Trainer's closing entry
    assert summary["train_loss"] == resumed["train_loss"] and summary["train_runtime"] == resumed["train_runtime"]


def test_a_run_killed_during_its_final_save_finishes_with_every_training_metric(finished_run, text_files, tmp_path):
    uninterrupted = finished_run[1]
    folder = copy_of(finished_run, tmp_path)
    lose(folder, *FINAL_SAVE)  # checkpoint-6, at max_steps, is complete: the run finishes from it
    finished = run(CAUSAL_LM, training_flags(folder, text_files))
    assert TRAINING_KEYS <= finished.keys()
    assert {key: finished[key] for key in ("train_loss", "total_flos")} == pytest.approx(
        {key: uninterrupted[key] for key in ("train_loss", "total_flos")}, rel=1e-6
    )
    assert json.loads((folder / "all_results.json").read_text()) == finished
    assert not (folder / "checkpoint-7").exists()


def test_a_run_resumed_from_a_checkpoint_without_totals_says_which_steps_its_metrics_cover(tmp_path):
    ids = torch.randint(0, 100, (32, 16), generator=torch.Generator().manual_seed(0)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    args = TyingTrainingArguments(
        output_dir=str(tmp_path), tying_strategy="none", max_steps=4, save_steps=2, logging_steps=1,
        per_device_train_batch_size=4, use_cpu=True, report_to=[], disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=GPT2.tied_model([0, 1]), args=args, train_dataset=data).train()  # a plain Trainer's checkpoints
    trainer = TyingTrainer(model=GPT2.tied_model([0, 1]), args=args, train_dataset=data)
    metrics = trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2")).metrics
    later_losses = [entry["loss"] for entry in trainer.state.log_history if entry.get("step", 0) > 2 and "loss" in entry]
    assert metrics["train_metrics_from_step"] == 2
    assert metrics["train_loss"] == pytest.approx(sum(later_losses) / 2, rel=1e-6)


# --- evaluating a saved model ----------------------------------------------------------------------------------------


def direct_loss(folder, text_files):
    """The loss of the saved model, loaded as an evaluator loads it, on the first 8 blocks of 32 validation tokens."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    lines = (text_files / "validation.txt").read_text().splitlines(keepends=True)
    ids = [token for line in lines for token in tokenizer(line)["input_ids"]][: 8 * 32]
    blocks = torch.tensor(ids).view(8, 32)
    with torch.no_grad():
        return model(input_ids=blocks, labels=blocks).loss.item()


def test_evaluating_a_checkpoint_scores_it_as_saved(finished_run, text_files, tmp_path):
    folder, _ = finished_run
    saved_map = json.loads((folder / "config.json").read_text())["tying_map"]
    assert saved_map not in (None, [0, 0, 0])  # a map the default strategy's start (all tied) would change
    flags = [*data_flags(text_files), "--model_name_or_path", str(folder), "--output_dir", str(tmp_path), "--do_eval"]
    metrics = run(CAUSAL_LM, flags)
    assert f"uses): `{' '.join(map(str, saved_map))}`" in (tmp_path / "README.md").read_text()  # the card's final map
    assert metrics["eval_loss"] == pytest.approx(direct_loss(folder, text_files), abs=1e-6)


def test_a_validation_file_is_evaluated_alone_and_not_trained_on(finished_run, text_files, tmp_path):
    folder, _ = finished_run
    flags = [*data_flags(text_files, train=False), "--model_name_or_path", str(folder), "--output_dir", str(tmp_path)]
    metrics = run(CAUSAL_LM, [*flags, "--do_eval"])
    assert metrics["eval_loss"] == pytest.approx(direct_loss(folder, text_files), abs=1e-6)
    with pytest.raises(ValueError, match="--validation_file needs --train_file .* pass --do_eval without --do_train"):
        run(CAUSAL_LM, [*flags, "--do_train"])


def test_the_saved_tokenizer_truncates_to_the_models_context(finished_run, text_files, tmp_path):
    folder, _ = finished_run
    assert AutoTokenizer.from_pretrained(folder).model_max_length == 32  # n_positions, not GPT-2's 1024
    lambada = tmp_path / "lambada.jsonl"
    lambada.write_text("\n".join(LAMBADA_TEST_FILE.read_text(encoding="utf-8").splitlines()[:16]) + "\n")
    run_lambada(["--model_name_or_path", str(folder), "--lambada_file", str(lambada), "--do_train", "--max_steps", "1",
                 "--tying_strategy", "none", "--output_dir", str(tmp_path / "ft"), "--report_to", "none",
                 "--per_device_train_batch_size", "4", "--disable_tqdm", "true"])  # fmt: skip
    assert AutoTokenizer.from_pretrained(tmp_path / "ft").model_max_length == 32


# --- a plain install, without the optional extras ---------------------------------------------------------------------

# Runs the scripts' code where matplotlib and TensorBoard cannot be imported, as on `pip install hf-layertie`.
WITHOUT_EXTRAS = """
import json, sys
for name in ("matplotlib", "tensorboard", "tensorboardX"):
    sys.modules[name] = None  # `import name` raises ImportError
from hf_layertie.lambada.run import run_lambada
from hf_layertie.language_modeling import CAUSAL_LM, run
clm, lambada = json.loads(sys.argv[1])
run(CAUSAL_LM, clm)
run_lambada(lambada)
"""


def test_the_default_run_and_lambada_evaluation_work_without_the_optional_extras(tmp_path):
    # The embedded default (which reports to TensorBoard and draws the plot), made small.
    clm = ["--output_dir", str(tmp_path / "clm"), "--max_steps", "2", "--per_device_train_batch_size", "2",
           "--config_overrides", "n_layer=2,n_embd=32,n_head=2", "--max_eval_samples", "2", "--sample_max_new_tokens", "0"]  # fmt: skip
    lambada = ["--model_name_or_path", str(tmp_path / "clm"), "--do_eval", "--max_eval_passages", "4",
               "--output_dir", str(tmp_path / "lambada"), "--report_to", "none"]  # fmt: skip
    process = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, json.dumps([clm, lambada])],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300,
    )  # fmt: skip
    output = process.stdout + process.stderr
    assert process.returncode == 0, output[-3000:]
    assert output.count("TensorBoard is not installed: not reporting to it") == 1
    assert output.count("matplotlib is not installed: tying_map.png is not drawn") == 1  # the training run's alone
    assert (tmp_path / "clm" / "model.safetensors").is_file() and not (tmp_path / "clm" / "tying_map.png").exists()
    assert "eval_lambada_accuracy" in json.loads((tmp_path / "lambada" / "eval_results.json").read_text())
