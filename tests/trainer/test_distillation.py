"""Knowledge distillation (`distill_from`): the mixed loss by hand, a frozen teacher outside the training state, exact
resume, refusals, run_clm.py end to end, relaxed ties, and two DDP ranks."""

import importlib
import json
import logging
import math
import re
from pathlib import Path

import datasets
import pytest
import torch
from helpers.models import BERT, GPT2, LLAMA, MISTRAL, QWEN2
from helpers.processes import REPO, launch
from helpers.scripts import tiny_flags
from helpers.training import (
    OptimizerMatchesModel,
    mix_by_hand,
    student_model,
    token_dataset,
    tying_args,
    without_dropout,
)
from safetensors.torch import load_file
from transformers import AutoTokenizer, HfArgumentParser

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, TyingTrainer, TyingTrainingArguments
from hf_layertie.data import embedded_tokenizer_dir
from hf_layertie.language_modeling import CAUSAL_LM, run
from hf_layertie.toolkit import load_model, load_tokenizer
from hf_layertie.trainer import TYING_STATE_NAME
from hf_layertie.trainer.checkpoint_format import read_tying_state
from hf_layertie.trainer.distillation import distillation_loss
from hf_layertie.trainer.training_args import DISTILLATION_SETTINGS

CAUSAL_KINDS = pytest.mark.parametrize("kind", [GPT2, LLAMA, QWEN2, MISTRAL], ids=lambda kind: kind.name)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A tied GPT-2 teacher of the students' sizes, other weights, saved without a tokenizer."""
    folder = tmp_path_factory.mktemp("teacher")
    student_model(seed=5).save_pretrained(folder)
    return folder


def distilled_trainer(output_dir, teacher, **overrides):
    """The tiny student on random rows, distilled from `teacher` (None: not distilled) under `overrides`."""
    settings = dict(tying_strategy="static:cycle:2", max_steps=8, distill_from=None if teacher is None else str(teacher))
    args = tying_args(output_dir, **{**settings, **overrides})
    return TyingTrainer(model=student_model(), args=args, train_dataset=token_dataset())


@CAUSAL_KINDS
def test_the_training_loss_is_the_hand_computed_mix_over_accumulated_micro_batches(tmp_path, kind):
    """One optimizer step of two micro-batches whose rows score different numbers of tokens (labels of -100): the
    logged loss is the mix over all the step's tokens, as if the batch were one (a per-micro-batch mean would not
    be). The teacher is a plain (untied) checkpoint; evaluation scores the student's next-token loss alone."""
    teacher = kind.plain_model(4, seed=5)
    teacher.save_pretrained(tmp_path / "teacher")
    student = without_dropout(kind.tied_model([0, 0, 2, 2]))
    ids = torch.randint(1, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, 3:] = -100  # 2 scored tokens in the first micro-batch's first row, 15 in the others
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})
    args = tying_args(
        tmp_path, tying_strategy="static:0,0,2,2", max_steps=1, learning_rate=0.0, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, distill_from=str(tmp_path / "teacher"), distillation_temperature=3.0,
        distillation_alpha=0.3,
    )  # fmt: skip
    trainer = TyingTrainer(model=student, args=args, train_dataset=data, eval_dataset=data)
    train_loss = trainer.train().training_loss
    eval_loss = trainer.evaluate()["eval_loss"]

    with torch.no_grad():
        student_logits, teacher_logits = trainer.model.eval()(input_ids=ids).logits, teacher(input_ids=ids).logits
    mix, cross_entropy = mix_by_hand(student_logits, teacher_logits, labels, temperature=3.0, alpha=0.3)
    assert train_loss == pytest.approx(mix, rel=1e-5)
    assert eval_loss == pytest.approx(cross_entropy, rel=1e-5)
    assert abs(mix - cross_entropy) > 0.1  # the KL term counts


def test_the_loss_function_is_the_mix_and_each_end_of_alpha_is_one_term():
    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 7, generator=generator), torch.randn(2, 5, 7, generator=generator)
    labels = torch.randint(0, 7, (2, 5), generator=generator)
    labels[1, 2] = -100
    mix, cross_entropy = mix_by_hand(student, teacher, labels, temperature=2.0, alpha=0.4)
    assert distillation_loss(student, teacher, labels, 2.0, 0.4).item() == pytest.approx(mix, rel=1e-6)
    assert distillation_loss(student, teacher, labels, 2.0, 0.0).item() == pytest.approx(cross_entropy, rel=1e-6)
    assert distillation_loss(student, None, labels, 2.0, 0.4).item() == pytest.approx(cross_entropy, rel=1e-6)
    assert distillation_loss(teacher, teacher, labels, 2.0, 1.0).item() == pytest.approx(0.0, abs=1e-6)
    # Divided by the step's count, not this micro-batch's: 7 scored tokens here, 14 in the step.
    half = distillation_loss(student, teacher, labels, 2.0, 0.4, num_items_in_batch=torch.tensor(14))
    assert half.item() == pytest.approx(mix / 2, rel=1e-6)


def parameters_of(model):
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def test_the_teacher_stays_frozen_outside_the_optimizer_the_model_and_its_checkpoints(tmp_path, teacher_dir):
    trainer = distilled_trainer(tmp_path, teacher_dir, save_strategy="steps", save_steps=4, learning_rate=1e-2)
    teacher = trainer.distillation.teacher
    before, student_before = parameters_of(teacher), parameters_of(trainer.model)
    metrics = trainer.train().metrics

    assert not teacher.training and not any(parameter.requires_grad for parameter in teacher.parameters())
    for name, value in parameters_of(teacher).items():
        assert torch.equal(value, before[name]) and teacher.get_parameter(name).grad is None, name
    assert any(not torch.equal(value, student_before[name]) for name, value in parameters_of(trainer.model).items())
    teacher_ids = {id(parameter) for parameter in teacher.parameters()}
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    assert not teacher_ids & {id(parameter) for group in optimizer.param_groups for parameter in group["params"]}
    assert not teacher_ids & {id(parameter) for parameter in trainer.model.parameters()}
    # The checkpoint holds the student's weights alone.
    assert set(load_file(tmp_path / "checkpoint-8" / "model.safetensors")) <= set(trainer.model.state_dict())
    expected_mib = sum(parameter.numel() * 4 for parameter in teacher.parameters()) / 2**20
    assert metrics["teacher_parameters_mib"] == pytest.approx(expected_mib) and expected_mib > 0


def test_a_distilled_run_resumed_from_its_checkpoint_equals_the_uninterrupted_run(tmp_path, teacher_dir):
    """DLT re-ties every 2 steps; the checkpoint of step 4 records the distillation settings, and the resumed run,
    which reloads the teacher, ends with the uninterrupted run's decisions and weights."""
    overrides = dict(tying_strategy="dlt", tying_interval=2, save_strategy="steps", save_steps=4, distillation_alpha=0.5)
    uninterrupted = distilled_trainer(tmp_path / "full", teacher_dir, **overrides)
    uninterrupted.train()
    resumed = distilled_trainer(tmp_path / "resumed", teacher_dir, **overrides)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"))

    saved = read_tying_state(tmp_path / "full" / "checkpoint-4")["settings"]
    assert {name: saved[name] for name in DISTILLATION_SETTINGS} == {
        "distill_from": str(teacher_dir.resolve()), "distillation_temperature": 2.0, "distillation_alpha": 0.5
    }
    assert [row["map"] for row in resumed.tying_records] == [row["map"] for row in uninterrupted.tying_records]
    final, expected = resumed.model.state_dict(), uninterrupted.model.state_dict()
    for name in expected:
        torch.testing.assert_close(final[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def distilled_checkpoint(tmp_path_factory, teacher_dir):
    """checkpoint-2 of a distilled static run (default temperature and weight) and of one without a teacher."""
    checkpoints = {}
    for name, teacher in (("distilled", str(teacher_dir)), ("plain", None)):
        output_dir = tmp_path_factory.mktemp(name)
        distilled_trainer(output_dir, teacher, max_steps=2, save_strategy="steps", save_steps=2).train()
        checkpoints[name] = output_dir / "checkpoint-2"
    return checkpoints


@pytest.mark.parametrize(
    "saved, overrides, message",
    [
        ("distilled", dict(distillation_temperature=3.0), r"distillation_temperature=2.0 there, 3.0 here"),
        ("distilled", dict(distillation_alpha=1.0), r"distillation_alpha=0.7142857142857143 there, 1.0 here"),
        ("distilled", dict(distill_from=None), r"distill_from='[^']*teacher[^']*' there, None here"),
        ("plain", dict(), r"distill_from=None there, '[^']*teacher[^']*' here"),
    ],
)
def test_resuming_under_other_distillation_settings_is_refused_naming_both(tmp_path, teacher_dir, distilled_checkpoint, saved, overrides, message):
    trainer = distilled_trainer(tmp_path, teacher_dir, **{"max_steps": 4, **overrides})
    with pytest.raises(ValueError, match=message):
        trainer.train(resume_from_checkpoint=str(distilled_checkpoint[saved]))
    assert trainer.state.global_step == 0


def test_the_same_teacher_named_by_a_relative_path_resumes(tmp_path, teacher_dir, distilled_checkpoint, monkeypatch):
    monkeypatch.chdir(teacher_dir.parent)
    trainer = distilled_trainer(tmp_path, teacher_dir.name, max_steps=4)
    assert trainer.train(resume_from_checkpoint=str(distilled_checkpoint["distilled"])).global_step == 4


def test_a_teacher_with_another_vocabulary_size_is_refused_naming_both(tmp_path):
    student_model(vocab_size=120).save_pretrained(tmp_path / "teacher")
    with pytest.raises(ValueError, match=rf"distill_from {re.escape(str(tmp_path / 'teacher'))}: the teacher's vocabulary has 120 tokens, the student's \(TiedGPT2LMHeadModel\) 100"):
        distilled_trainer(tmp_path / "run", tmp_path / "teacher")


def test_a_teacher_with_a_shorter_context_than_the_batches_is_refused_naming_it(tmp_path):
    student_model(n_positions=8).save_pretrained(tmp_path / "teacher")  # the rows hold 16 tokens
    with pytest.raises(ValueError, match=r"distill_from .*teacher: the teacher reads 8 positions, and the batches hold 16 tokens"):
        distilled_trainer(tmp_path / "run", tmp_path / "teacher").train()


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tmp_path):
    student_tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir("shakespeare-bpe"))
    teacher_tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir("shakespeare-wordpiece"))
    student_model(vocab_size=len(student_tokenizer), seed=5).save_pretrained(tmp_path / "teacher")
    teacher_tokenizer.save_pretrained(tmp_path / "teacher")
    args = tying_args(tmp_path / "run", tying_strategy="static:all", distill_from=str(tmp_path / "teacher"))
    message = (
        rf"the teacher's tokenizer \(2048 tokens\) differs from the student's \({re.escape(student_tokenizer.name_or_path)}, "
        r"2048 tokens\): '.*' is token .* there and .* here"
    )
    with pytest.raises(ValueError, match=message):
        TyingTrainer(model=student_model(vocab_size=2048), args=args, train_dataset=token_dataset(), processing_class=student_tokenizer)
    student_tokenizer.save_pretrained(tmp_path / "teacher")  # the same tokenizer: accepted
    trainer = TyingTrainer(model=student_model(vocab_size=2048), args=args, train_dataset=token_dataset(), processing_class=student_tokenizer)
    assert trainer.distillation is not None


def test_a_teacher_without_tokenizer_files_is_compared_by_its_special_token_ids(tmp_path, caplog):
    """A causal teacher built with the WordPiece tokenizer and saved without it has the student's vocabulary size,
    and its config's token ids are the WordPiece ones: refused by name. One built with the student's tokenizer is
    accepted, with a warning that its tokens could not be compared."""
    student_tokenizer = load_tokenizer("shakespeare-bpe")
    overrides = "n_layer=2,n_embd=32,n_head=2,n_positions=32"
    load_model("tied_gpt2", load_tokenizer("shakespeare-wordpiece"), config_overrides=overrides).save_pretrained(tmp_path / "wordpiece")
    args = tying_args(tmp_path / "run", tying_strategy="static:all", distill_from=str(tmp_path / "wordpiece"))
    message = (
        r"the teacher was saved without tokenizer files, and its config's special token ids differ from the "
        r"student's \(bos_token_id 50256 there and 0 here; eos_token_id 50256 there and 0 here\)"
    )
    with pytest.raises(ValueError, match=message):
        TyingTrainer(model=load_model("tied_gpt2", student_tokenizer, config_overrides=overrides), args=args, train_dataset=token_dataset(), processing_class=student_tokenizer)
    load_model("tied_gpt2", student_tokenizer, config_overrides=overrides).save_pretrained(tmp_path / "bpe")
    args = tying_args(tmp_path / "run", tying_strategy="static:all", distill_from=str(tmp_path / "bpe"))
    with caplog.at_level(logging.WARNING, logger="hf_layertie.trainer.distillation"):
        TyingTrainer(model=load_model("tied_gpt2", student_tokenizer, config_overrides=overrides), args=args, train_dataset=token_dataset(), processing_class=student_tokenizer)
    assert "the teacher was saved without tokenizer files" in caplog.text and "whether its tokens are the student's is not known" in caplog.text


def test_a_masked_language_model_student_is_refused(tmp_path, teacher_dir):
    args = tying_args(tmp_path, tying_strategy="static:all", distill_from=str(teacher_dir))
    with pytest.raises(ValueError, match=r"the student, a TiedBertForMaskedLM, has loss_type 'ForMaskedLM': masked language models \(BERT\) are not distilled"):
        TyingTrainer(model=BERT.tied_model([0, 1, 2, 3]), args=args, train_dataset=token_dataset())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(distillation_temperature=2.0), r"distillation_temperature only apply with distill_from"),
        (dict(distillation_alpha=0.5, distillation_temperature=1.0), r"distillation_temperature, distillation_alpha only apply with distill_from"),
        (dict(distill_from="t", distillation_temperature=0.0), r"distillation_temperature must be a positive number, got 0.0"),
        (dict(distill_from="t", distillation_alpha=1.5), r"distillation_alpha must be in \[0, 1\], got 1.5"),
    ],
)
def test_distillation_settings_are_checked_when_the_arguments_are_built(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tying_args(tmp_path, tying_strategy="static:all", **overrides)


def test_the_defaults_are_distilberts_and_apply_only_with_a_teacher(tmp_path):
    plain = tying_args(tmp_path, tying_strategy="static:all")
    assert (plain.distill_from, plain.distillation_temperature, plain.distillation_alpha) == (None, None, None)
    distilled = tying_args(tmp_path, tying_strategy="static:all", distill_from="teacher")
    assert (distilled.distillation_temperature, distilled.distillation_alpha) == (2.0, 5 / 7)
    assert distilled.without_tying().distill_from is None  # evaluation alone loads no teacher
    assert "distill_from" not in distilled.strategy_settings() and "distill_from" in distilled.tying_fields()


def test_a_missing_teacher_is_named(tmp_path):
    with pytest.raises(ValueError, match=rf"distill_from {re.escape(str(tmp_path / 'nowhere'))}: could not load a causal language model"):
        distilled_trainer(tmp_path / "run", tmp_path / "nowhere")


def test_a_missing_teacher_folder_is_refused_by_run_clm_before_anything_loads(tmp_path, monkeypatch):
    """Named as a missing folder (not a malformed Hub id), before the tokenizer, the student or the data load."""
    workflow = importlib.import_module("hf_layertie.language_modeling.run")
    monkeypatch.setattr(workflow, "load_tokenizer", lambda *args, **kwargs: pytest.fail("loaded before the check"))
    missing = tmp_path / "no" / "teacher"
    with pytest.raises(ValueError, match=rf"^--distill_from {re.escape(str(missing))}: no such folder, and not a Hub repo id"):
        run(CAUSAL_LM, ["--distill_from", str(missing), "--output_dir", str(tmp_path / "run"), "--max_steps", "1"])


def test_run_clm_flags_and_help_name_the_distillation_settings():
    parser = HfArgumentParser(TyingTrainingArguments)
    help_text = parser.format_help()
    for flag in ("--distill_from", "--distillation_temperature", "--distillation_alpha"):
        assert flag in help_text, flag
    assert "DistilBERT" in help_text


@pytest.fixture(scope="module")
def trained_teacher(tmp_path_factory):
    """A 4-block tied GPT-2 with the shipped tokenizer, saved with it: what a finished run_clm.py run leaves."""
    folder = tmp_path_factory.mktemp("trained")
    tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir("shakespeare-bpe"))
    torch.manual_seed(5)
    config = TiedGPT2Config(n_layer=4, n_embd=16, n_head=2, n_positions=32, vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0)
    TiedGPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_run_clm_converts_and_distils_a_trained_model_and_its_card_names_the_teacher(tmp_path, text_files, trained_teacher):
    flags = tiny_flags(tmp_path, text_files, "unused", "--tying_strategy", "static:sequence:2", "--tie_init", "mean")
    at = flags.index("--config_overrides")
    del flags[at : at + 2]  # the model is the trained one
    distil = ["--model_name_or_path", str(trained_teacher), "--distill_from", str(trained_teacher), "--distillation_temperature", "1.5"]
    metrics = run(CAUSAL_LM, [*flags, *distil, "--max_steps", "4", "--save_steps", "2"])

    assert metrics["teacher_parameters_mib"] > 0 and math.isfinite(metrics["eval_loss"])
    card = (tmp_path / "README.md").read_text()
    for line in (f"- distill_from: {trained_teacher}", "- distillation_temperature: 1.5", f"- distillation_alpha: {5 / 7}"):
        assert line in card, line
    assert read_tying_state(tmp_path)["settings"]["distillation_temperature"] == 1.5
    assert json.loads((tmp_path / "config.json").read_text())["tying_map"] == [0, 0, 2, 2]
    # The finished run is not repeated under another weight: its results are those of its own settings.
    with pytest.raises(ValueError, match=r"distillation_alpha=0.7142857142857143 there, 0.5 here"):
        run(CAUSAL_LM, [*flags, *distil, "--max_steps", "4", "--save_steps", "2", "--distillation_alpha", "0.5"])


def test_relaxed_ties_distil_keep_the_optimizer_in_step_and_resume_exactly(tmp_path, teacher_dir):
    """static:0,0,2,2 with a rank-2 LoRA per position, distilled: the adapters and shared weights are the optimizer's
    at every step (never the teacher's), and a resumed run ends where the uninterrupted one does."""
    overrides = dict(tying_strategy="static:0,0,2,2", tie_init="mean", lora_rank=2, max_steps=6, save_strategy="steps", save_steps=3)
    uninterrupted = distilled_trainer(tmp_path / "full", teacher_dir, **overrides)
    check = OptimizerMatchesModel()
    check.trainer = uninterrupted
    uninterrupted.add_callback(check)
    uninterrupted.train()
    assert check.checked_steps == 6
    resumed = distilled_trainer(tmp_path / "resumed", teacher_dir, **overrides)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))

    final, expected = resumed.model.state_dict(), uninterrupted.model.state_dict()
    assert final.keys() == expected.keys() and any("lora_" in name for name in final)
    for name in expected:
        torch.testing.assert_close(final[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_two_ranks_distil_identically_and_resume_exactly(tmp_path, teacher_dir):
    """Two gloo processes: the ranks end with the same weights, the resumed run with the uninterrupted one's, and
    the teacher with its own."""
    launch([str(REPO / "tests" / "scripts" / "ddp_distill_run.py"), str(tmp_path), str(teacher_dir)], cwd=tmp_path)
    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2
    teacher = load_file(Path(teacher_dir) / "model.safetensors")
    for rank in (rank0, rank1):
        for name, tensor in rank["full"].items():
            assert torch.equal(tensor, rank["resumed"][name]), f"{name} differs after resuming"
            assert torch.equal(tensor, rank0["full"][name]), f"ranks differ in {name}"
        for name, tensor in rank["teacher"].items():
            if name in teacher:
                assert torch.equal(tensor, teacher[name]), f"the teacher's {name} changed"
    assert (tmp_path / "full" / "checkpoint-4" / TYING_STATE_NAME).is_file()
