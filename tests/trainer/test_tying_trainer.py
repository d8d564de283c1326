"""TyingTrainer: decisions inside training_step, optimizer in step with the model, resume, logging, errors."""

import json
import os
import re
import shutil
import subprocess
import sys

import datasets
import matplotlib.pyplot as plt
import pytest
import torch
import transformers
from helpers.models import every_kind
from helpers.training import OptimizerMatchesModel, make_trainer, tiny_model, token_dataset, torch_optimizer, tying_args
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback

from hf_layertie import TyingTrainer, TyingTrainingArguments
from hf_layertie.decisions import Decision, Observation, SimilarityDecisions
from hf_layertie.dlt import PaperAgent
from hf_layertie.models import TyingMap
from hf_layertie.trainer import TYING_HISTORY_NAME, TYING_PLOT_NAME, TYING_STATE_NAME, finished_training_step
from hf_layertie.trainer.checkpoint_format import TYING_STATE_FORMAT_VERSION, last_complete_checkpoint


@every_kind
def test_the_trainer_reports_the_mean_loss_of_the_tokens_the_model_scores(tmp_path, kind):
    """Training and evaluation losses equal the mean token loss computed by hand: a causal model scores L - 1
    tokens of a row of L (the first has no prediction), a masked one its labelled tokens. The Trainer divides the
    summed loss by a count of its own; for GPT-2 it once counted every label, which made every loss low by
    (L - 1) / L."""
    model = kind.tied_model([0, 0, 2, 2])
    for module in model.modules():  # the losses of a training step and of evaluation then agree
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    ids = torch.randint(1, 100, (12, 16), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    if not kind.causal:  # four labelled tokens per row, so that every batch scores as many tokens per row
        keep = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)).argsort(dim=1)[:, :4]
        labels = torch.full_like(ids, -100).scatter(1, keep, ids.gather(1, keep))
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})
    args = tying_args(tmp_path, tying_strategy="none", max_steps=3, learning_rate=0.0, per_device_eval_batch_size=5)
    trainer = TyingTrainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    train_loss = trainer.train().training_loss  # three batches of 4 rows: every row once, the weights unchanged
    eval_loss = trainer.evaluate()["eval_loss"]  # batches of 5, 5 and 2 rows

    with torch.no_grad():
        logits = trainer.model(input_ids=ids).logits
    if kind.causal:
        logits, labels = logits[:, :-1], labels[:, 1:]
    by_hand = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100).item()
    assert eval_loss == pytest.approx(by_hand, rel=1e-5)
    assert train_loss == pytest.approx(by_hand, rel=1e-5)


def assert_records_close(records, expected):
    """Same decisions; numbers equal up to float noise (the resumed run re-computes them in another order)."""
    assert len(records) == len(expected)
    for record, reference in zip(records, expected):
        assert record.keys() == reference.keys()
        for key, value in reference.items():
            if isinstance(value, float):
                assert record[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
            else:
                assert record[key] == value, key


class DistinctBlocksWithinCap(TrainerCallback):
    """After every optimizer step: the model's distinct blocks and its optimizer stay within the cap."""

    def __init__(self, cap):
        self.trainer, self.cap, self.seen = None, cap, []

    def on_step_end(self, args, state, control, **kwargs):
        model = self.trainer.model
        self.seen.append(model.tying_map.num_distinct)
        assert model.tying_map.num_distinct <= self.cap
        one_block = sum(parameter.numel() for parameter in model.tied_blocks[0].parameters())
        counts = model.parameter_counts()
        assert counts.blocks <= self.cap * one_block
        optimizer_numel = sum(parameter.numel() for group in torch_optimizer(self.trainer).param_groups for parameter in group["params"])
        assert optimizer_numel == counts.trainable


def test_dlt_run_makes_many_decisions_and_keeps_the_optimizer_in_step(tmp_path):
    check = OptimizerMatchesModel()
    trainer = make_trainer(tmp_path, callbacks=[check])
    check.trainer = trainer
    trainer.train()

    records = trainer.tying_records
    assert [record["step"] for record in records] == list(range(0, 24, 2))
    assert len({tuple(record["map"]) for record in records}) > 2, "the map should change during a DLT run"
    assert check.checked_steps == 24
    # Every row carries its own decision's reward: the loss of the 2 steps after it, as the Trainer computed it.
    assert all(isinstance(record["reward"], float) and record["reward"] == -record["loss"] for record in records)
    assert sum(trainer.tying_seconds.values()) > 0


def test_dlt_starts_from_every_block_tied_to_block_0_as_in_the_paper(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1, tying_interval=100)
    assert trainer.model.tying_map.to_list() == [0, 0, 0, 0]
    trainer.train()
    assert trainer.tying_records[0]["map"] in ([0, 0, 0, 0], [0, 1, 0, 0])  # block 1 stays tied or unties


def test_max_distinct_blocks_holds_at_every_step(tmp_path):
    check = DistinctBlocksWithinCap(cap=2)
    trainer = make_trainer(
        tmp_path, model=tiny_model(num_blocks=6), tying_strategy="random", max_distinct_blocks=2, tying_interval=1,
        max_steps=40, callbacks=[check],
    )  # fmt: skip
    check.trainer = trainer
    trainer.train()
    assert len(check.seen) == 40 and max(check.seen) == 2  # the random agent reaches the cap and never passes it


def test_an_initial_map_above_the_cap_is_refused(tmp_path):
    with pytest.raises(ValueError, match="tying_initial_map='independent' has 4 blocks owning weights, more than max_distinct_blocks=2"):
        make_trainer(tmp_path, tying_initial_map="independent", max_distinct_blocks=2)


def test_decisions_happen_once_per_optimizer_step_with_gradient_accumulation(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=6, tying_interval=1, gradient_accumulation_steps=3)
    trainer.train()
    records = trainer.tying_records
    assert [record["step"] for record in records] == list(range(6))
    # The window loss of one step is the mean of its 3 micro-batches, as the Trainer's own logged loss.
    assert all(2.0 < record["loss"] < 6.0 for record in records)


def test_untied_block_gets_fresh_parameters_that_train(tmp_path):
    model = tiny_model()
    shared_before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    # One decision at step 0 on the all-tied start; agent seed 3 makes it an untie of block 1.
    trainer = make_trainer(tmp_path, model=model, tying_strategy="random", tying_interval=100, max_steps=5, agent_seed=3)
    trainer.train()
    assert trainer.tying_records[0]["map"] == [0, 1, 0, 0]

    untied = dict(model.transformer.h[1].named_parameters())
    for index in (0, 2, 3):
        for name, parameter in model.transformer.h[index].named_parameters():
            assert parameter is not untied[name]
            assert parameter.data_ptr() != untied[name].data_ptr()
    # It started as a copy of the shared weights (step 0, before any update) and trained on its own since.
    assert not torch.equal(untied["mlp.c_fc.weight"], shared_before)
    assert not torch.equal(untied["mlp.c_fc.weight"], model.transformer.h[0].mlp.c_fc.weight)
    optimizer = torch_optimizer(trainer)
    assert all(parameter in optimizer.state for parameter in untied.values())


@pytest.mark.parametrize(
    "strategy, expected_map",
    [
        ("static:cycle:2", [0, 1, 0, 1]),
        ("static:all", [0, 0, 0, 0]),
        ("static:0,0,2,2", [0, 0, 2, 2]),
        ("none", [0, 1, 2, 3]),
        ("random", None),
        ("similarity:2", None),
    ],
)
def test_every_strategy_runs_through_the_same_trainer(tmp_path, strategy, expected_map):
    warmup = {"similarity_warmup_steps": 2} if strategy.startswith("similarity") else {}
    trainer = make_trainer(tmp_path, tying_strategy=strategy, max_steps=6, **warmup)
    result = trainer.train()
    assert result.global_step == 6
    if expected_map is not None:
        assert trainer.model.tying_map.to_list() == expected_map
    if strategy == "random":
        assert all(record["explored"] for record in trainer.tying_records)
    if strategy.startswith("similarity"):
        (record,) = trainer.tying_records
        assert record["step"] == 2 and record["distinct_blocks"] == 2 and len(record["angular_distances"]) == 4
        assert trainer.model.tying_map.num_distinct == 2


def test_the_paper_variant_runs_through_the_trainer_with_its_own_agent(tmp_path):
    trainer = make_trainer(tmp_path, dlt_variant="paper", max_steps=8)
    trainer.train()
    assert isinstance(trainer.decisions.controller.agent, PaperAgent)
    assert trainer.decisions.controller.reward.reward_kind == "clipped_negative_perplexity"
    assert all(record["reward"] == -10.0 for record in trainer.tying_records)  # loss > log(10): no signal


def test_the_paper_agent_with_a_reward_that_carries_signal_learns_from_the_negative_loss(tmp_path):
    trainer = make_trainer(tmp_path, dlt_variant="paper", reward_kind="negative_loss", max_steps=8)
    trainer.train()
    assert isinstance(trainer.decisions.controller.agent, PaperAgent)
    records = [record for record in trainer.tying_records if record.get("reward") is not None]
    assert records and all(record["reward"] == pytest.approx(-record["loss"]) for record in records)


def test_commit_after_exploration_stops_deciding_when_exploration_ends(tmp_path):
    # 24 steps, k = 2: 12 planned decisions, exploration over 80% of them: decisions at steps 0, 2, ..., 18.
    trainer = make_trainer(tmp_path, commit_after_exploration=True)
    maps = MapsPerStep()
    maps.trainer = trainer
    trainer.add_callback(maps)
    trainer.train()
    assert [record["step"] for record in trainer.tying_records] == list(range(0, 20, 2))
    assert len({tuple(tying_map) for tying_map in maps.after_step[19:]}) == 1  # steps 20-24 train one map


def test_a_run_continued_to_more_steps_keeps_its_exploration_schedule(tmp_path, caplog):
    """A finished run of 24 steps (12 decisions, exploration over 80% of them) continued to 48: the schedule of the
    run as started is kept, so the added decisions take its end (epsilon at its floor; re-planned over 48 steps,
    about 0.5 at step 24), and with `commit_after_exploration` none follows the commit step (20)."""
    for commit in (False, True):
        folder = tmp_path / f"commit-{commit}"
        make_trainer(folder, commit_after_exploration=commit, save_strategy="steps", save_steps=24).train()
        caplog.clear()
        with caplog.at_level("WARNING"):
            longer = make_trainer(folder, commit_after_exploration=commit, save_strategy="steps", save_steps=24, max_steps=48)
            longer.train(resume_from_checkpoint=str(folder / "checkpoint-24"))
        assert "the checkpoint's exploration schedule spans 12 decisions" in caplog.text
        added = [record for record in longer.tying_records if record["step"] >= 24]
        if commit:
            assert not added and max(record["step"] for record in longer.tying_records) == 18
        else:
            floor = longer.decisions.controller.agent.config.epsilon_min
            assert len(added) == 12 and all(record["epsilon"] == floor for record in added)


@pytest.mark.parametrize("strategy", ["dlt", "random"])
def test_a_run_too_short_for_every_block_to_decide_says_so(tmp_path, caplog, strategy):
    """4 blocks: 3 take turns to decide; 4 steps at k = 2 make 2 decisions."""
    with caplog.at_level("WARNING"):
        make_trainer(tmp_path, tying_strategy=strategy, max_steps=4).train()
    assert f"tying_strategy='{strategy}': 2 decision(s) in 4 steps at tying_interval=2, fewer than the 3 blocks" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        make_trainer(tmp_path / "long", tying_strategy=strategy, max_steps=6).train()
    assert "fewer than the 3 blocks" not in caplog.text


class MapsPerStep(TrainerCallback):
    def __init__(self):
        self.trainer, self.after_step = None, []

    def on_step_end(self, args, state, control, **kwargs):
        self.after_step.append(self.trainer.model.tying_map.to_list())


def test_a_held_out_reward_is_evaluated_in_micro_batch_chunks(tmp_path):
    sizes = []
    model = tiny_model()
    trainer = make_trainer(tmp_path, model=model, reward_source="held_out", reward_batch_size=10, max_steps=6)
    handle = model.transformer.register_forward_hook(lambda module, args, output: sizes.append(output[0].shape[0]))
    trainer.train()
    handle.remove()
    assert max(sizes) == 4  # per_device_train_batch_size: the reward never runs a larger batch
    rewards = [record["reward"] for record in trainer.tying_records]
    assert all(isinstance(reward, float) for reward in rewards)


def test_the_held_out_reward_and_the_paper_agent_reseed_no_accelerator_generator(tmp_path, monkeypatch):
    """Both seed a forked CPU generator; torch.manual_seed would also reseed every GPU's, which the fork does not
    restore, so a GPU run's dropout would change at the first reward, and differ after a resumption."""
    reseeded = []
    reseed = torch.cuda.manual_seed_all
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: (reseeded.append(seed), reseed(seed)))
    trainer = make_trainer(tmp_path, reward_source="held_out", reward_batch_size=10, max_steps=6, dlt_variant="paper", agent_seed=7)
    trainer.train()
    assert len(trainer.tying_records) == 3 and set(reseeded) == {trainer.args.seed}  # the Trainer's own set_seed only


def test_decisions_are_logged_to_log_history_jsonl_and_a_plot(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=8)
    trainer.train()
    trainer.save_model()

    logged = [entry for entry in trainer.state.log_history if "tying/map" in entry]
    assert len(logged) == 5  # 4 decisions, and the last one's reward after training
    assert {"tying/distinct_blocks", "tying/trainable_parameters", "tying/epsilon"} <= set(logged[0])
    assert {"tying/reward", "tying/loss", "tying/advantage", "tying/q_error"} <= set(logged[1])
    rows = [json.loads(line) for line in (tmp_path / TYING_HISTORY_NAME).read_text().splitlines()]
    assert rows == trainer.tying_records and len(rows) == 4
    image = plt.imread(tmp_path / TYING_PLOT_NAME)
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_a_fresh_run_starts_a_fresh_history_and_writes_strict_json(tmp_path):
    (tmp_path / TYING_HISTORY_NAME).write_text('{"from": "an earlier run"}\n')
    trainer = make_trainer(tmp_path, max_steps=4)
    trainer.decisions.controller.reward.reward_block_cost = 0.0
    trainer.train()
    lines = (tmp_path / TYING_HISTORY_NAME).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 2]
    assert "NaN" not in "".join(lines)


def test_resume_from_checkpoint_equals_the_uninterrupted_run(tmp_path):
    overrides = dict(max_steps=20, save_strategy="steps", save_steps=10)
    uninterrupted = make_trainer(tmp_path / "full", **overrides)
    uninterrupted.train()
    checkpoint = tmp_path / "full" / "checkpoint-10"
    assert (checkpoint / TYING_STATE_NAME).is_file()

    resumed = make_trainer(tmp_path / "resumed", **overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))

    assert resumed.model.tying_map == uninterrupted.model.tying_map
    assert_records_close(resumed.tying_records, uninterrupted.tying_records)
    final, expected = resumed.model.state_dict(), uninterrupted.model.state_dict()
    for name in expected:
        torch.testing.assert_close(final[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    history = [json.loads(line) for line in (tmp_path / "resumed" / TYING_HISTORY_NAME).read_text().splitlines()]
    assert_records_close(history, uninterrupted.tying_records)


def test_an_unstamped_tying_state_resumes_as_the_uninterrupted_run_and_pre_release_or_newer_ones_are_named(tmp_path):
    """The tying state is versioned (`format_version`, `migrate_tying_state`): a state of 0.1.0 written before the
    stamp (layout 0), without the settings added since, resumes as the uninterrupted run; a pre-release layout
    (without training totals) and a newer one are refused naming the file."""
    overrides = dict(tying_strategy="dlt", max_steps=8, save_strategy="steps", save_steps=4)
    uninterrupted = make_trainer(tmp_path / "full", **overrides)
    uninterrupted.train()
    checkpoint = tmp_path / "full" / "checkpoint-4"
    path = checkpoint / TYING_STATE_NAME
    state = torch.load(path, weights_only=True)
    assert state["format_version"] == TYING_STATE_FORMAT_VERSION
    unstamped = {key: value for key, value in state.items() if key != "format_version"}
    unstamped["settings"] = {name: value for name, value in state["settings"].items() if name not in ("loop_lr_exponent", "distill_from")}
    torch.save(unstamped, path)  # as written before the stamp, whose digest covers the Trainer's files only

    resumed = make_trainer(tmp_path / "resumed", **overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.tying_records == uninterrupted.tying_records
    final, expected = resumed.model.state_dict(), uninterrupted.model.state_dict()
    assert all(torch.equal(final[name], expected[name]) for name in expected)

    for layout, message in (
        ({key: value for key, value in unstamped.items() if key != "training"}, r"tying state of a pre-release layout \(without training\)"),
        (
            {**unstamped, "decisions": {key: value for key, value in unstamped["decisions"].items() if key != "planned_decisions"}},
            r"tying state of a pre-release layout \(without planned_decisions\)",
        ),
        ({**state, "format_version": True}, r"tying state format True, not a format version"),
        ({**state, "format_version": TYING_STATE_FORMAT_VERSION + 1}, rf"tying state format {TYING_STATE_FORMAT_VERSION + 1}, newer than"),
    ):
        torch.save(layout, path)
        with pytest.raises(ValueError, match=rf"{re.escape(str(path))} (holds a|has) {message}"):  # the file, named
            make_trainer(tmp_path / "again", **overrides).train(resume_from_checkpoint=str(checkpoint))


def test_a_strategy_receives_its_own_settings_and_refuses_the_training_arguments():
    args = tying_args("unused", tying_strategy="similarity:2")
    settings = SimilarityDecisions.settings_from(args)
    assert settings.argument == "2" and settings.similarity_warmup_steps == args.similarity_warmup_steps
    with pytest.raises(TypeError, match="SimilarityDecisions takes its SimilaritySettings \\(see settings_from\\), got TyingTrainingArguments"):
        SimilarityDecisions(args, num_blocks=4)


def test_a_strategy_decides_from_what_it_observes_and_returns_the_decision_on_the_main_process():
    args = tying_args("unused", tying_strategy="similarity:2")
    strategy = SimilarityDecisions(SimilarityDecisions.settings_from(args), num_blocks=4)

    def observation(is_main_process):
        def unavailable(*_):
            raise AssertionError("similarity measures the blocks only")

        return Observation(
            step=0,
            max_steps=24,
            tying_map=TyingMap([0, 1, 2, 3]),
            current=None,
            is_main_process=is_main_process,
            process_index=0 if is_main_process else 1,
            num_processes=2,
            held_out_loss=unavailable,
            block_distances=lambda: [0.0, 0.1, 0.9, 0.1],
            mean_over_processes=unavailable,
            gather=unavailable,
        )

    assert strategy.is_due(0, current=None)
    decision = strategy.decide(observation(is_main_process=True))
    assert isinstance(decision, Decision) and decision.map_after.num_distinct == 2
    assert decision.map_before == TyingMap([0, 1, 2, 3]) and decision.angular_distances == [0.0, 0.1, 0.9, 0.1]
    assert decision.completed and not strategy.is_due(1, current=decision)
    assert strategy.decide(observation(is_main_process=False)) is None  # the trainer sends the main process's


@pytest.fixture(scope="module")
def saved_checkpoints(tmp_path_factory):
    """`{strategy: checkpoint-2 of a 2-step run}` for a DLT run and a conventional one."""
    checkpoints = {}
    for strategy in ("dlt", "none"):
        output_dir = tmp_path_factory.mktemp(strategy)
        make_trainer(output_dir, tying_strategy=strategy, max_steps=2, save_strategy="steps", save_steps=2).train()
        checkpoints[strategy] = output_dir / "checkpoint-2"
    return checkpoints


START_AFRESH = r"To continue that run, repeat its settings; to start a new one, train into a new output_dir, or delete"


@pytest.mark.parametrize(
    "saved, overrides, message",
    [
        ("dlt", dict(tying_strategy="static:all"), r"\(tying_strategy='dlt' there, 'static:all' here\)"),
        ("dlt", dict(tying_strategy="random", tying_interval=5), r"\(tying_strategy='dlt' there, 'random' here\)"),
        ("dlt", dict(tying_strategy="none"), r"\(tying_strategy='dlt' there, 'none' here\)"),
        ("dlt", dict(epsilon_start=0.5, tying_interval=3), r"\(tying_interval=2 there, 3 here; epsilon_start=None there, 0.5 here\)"),
        ("dlt", dict(max_distinct_blocks=3), r"\(max_distinct_blocks=None there, 3 here\)"),
        ("dlt", dict(reward_block_cost=0.1), r"\(reward_block_cost=0.0 there, 0.1 here\)"),
        ("none", dict(tying_strategy="dlt"), r"\(tying_strategy='none' there, 'dlt' here\)"),
    ],
)
def test_resuming_under_other_tying_settings_is_refused_naming_both_values(tmp_path, saved_checkpoints, saved, overrides, message):
    trainer = make_trainer(tmp_path, max_steps=4, **overrides)
    with pytest.raises(ValueError, match=message) as error:
        trainer.train(resume_from_checkpoint=str(saved_checkpoints[saved]))
    assert START_AFRESH in str(error.value) and str(saved_checkpoints[saved].parent) in str(error.value)
    assert trainer.state.global_step == 0


def test_a_checkpoint_without_its_tying_state_is_refused_by_a_tying_run(tmp_path, saved_checkpoints):
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(saved_checkpoints["dlt"], checkpoint)
    (checkpoint / TYING_STATE_NAME).unlink()
    trainer = make_trainer(tmp_path / "run", max_steps=4)
    with pytest.raises(ValueError, match=f"cannot resume tying_strategy=.dlt. from {re.escape(str(checkpoint))}: it has no {TYING_STATE_NAME}"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 0


def test_the_plot_setting_may_differ_on_resume(tmp_path, saved_checkpoints):
    trainer = make_trainer(tmp_path, max_steps=4, tying_plot=False)
    assert trainer.train(resume_from_checkpoint=str(saved_checkpoints["dlt"])).global_step == 4
    plain = make_trainer(tmp_path / "none", tying_strategy="none", max_steps=4, tying_plot=False)
    assert plain.train(resume_from_checkpoint=str(saved_checkpoints["none"])).global_step == 4


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is not a readable tying state"),
        (b"garbage, not a torch file", "is not a readable tying state"),
        ({"controller": None}, r"is not a tying state: expected a dict with the keys \['decisions', 'settings', 'tying_strategy'\]"),
    ],
)
def test_an_unreadable_tying_state_is_named_on_resume(tmp_path, saved_checkpoints, content, message):
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(saved_checkpoints["dlt"], checkpoint)
    state_file = checkpoint / TYING_STATE_NAME
    if isinstance(content, bytes):
        state_file.write_bytes(content)
    else:
        torch.save(content, state_file)
    with pytest.raises(ValueError, match=f"^{state_file} {message}"):
        make_trainer(tmp_path / "run", max_steps=4).train(resume_from_checkpoint=str(checkpoint))


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("damaged", ["trainer_state.json", "optimizer.pt", "model.safetensors", "config.json"])
def test_a_damaged_file_in_a_checkpoint_is_named_and_the_checkpoint_before_it_is_resumed(tmp_path, saved_checkpoints, damaged):
    for step in (1, 2):  # two complete checkpoints, the later one damaged by a kill or a full disk
        shutil.copytree(saved_checkpoints["dlt"], tmp_path / f"checkpoint-{step}")
    truncate(tmp_path / "checkpoint-2" / damaged)
    with pytest.raises(ValueError) as error:
        make_trainer(tmp_path / "run", max_steps=4).train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    named = str(tmp_path / "checkpoint-2" / damaged) + " is damaged", f"{tmp_path / 'checkpoint-2'}: damaged {damaged} ("
    assert any(name in str(error.value) for name in named) and f"delete the folder {tmp_path / 'checkpoint-2'}" in str(error.value)
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-1"


def test_a_tying_state_copied_from_another_run_is_refused(tmp_path):
    """Two runs of other seeds, each saved at step 2; run B's tying_state.pt copied into run A's checkpoint would
    give A B's decisions and training totals (its reported train_loss changed)."""
    for name, seed in (("a", 1), ("b", 2)):
        make_trainer(tmp_path / name, model=tiny_model(seed=seed), max_steps=2, save_strategy="steps", save_steps=2).train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    make_trainer(tmp_path / "resumed", max_steps=3).train(resume_from_checkpoint=str(checkpoint))  # its own: accepted
    shutil.copy(tmp_path / "b" / "checkpoint-2" / TYING_STATE_NAME, checkpoint / TYING_STATE_NAME)
    with pytest.raises(ValueError, match=rf"^cannot resume from {re.escape(str(checkpoint))}: its tying_state.pt was saved beside another trainer_state.json and weights"):
        make_trainer(tmp_path / "again", max_steps=3).train(resume_from_checkpoint=str(checkpoint))


def test_a_damaged_final_trainer_state_is_named_with_the_way_on(tmp_path):
    trainer = make_trainer(tmp_path, tying_strategy="none", max_steps=2)
    trainer.train()
    trainer.save_state()
    trainer_state = tmp_path / "trainer_state.json"
    assert finished_training_step(tmp_path, 2) == 2
    truncate(trainer_state)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(trainer_state))} is damaged \(JSONDecodeError: .*\): delete the damaged file, and a re-run"):
        finished_training_step(tmp_path, 2)


def test_the_final_trainer_state_is_written_atomically(tmp_path, monkeypatch):
    """A kill while the final trainer_state.json is written leaves the old file whole (transformers writes in place)."""
    trainer = make_trainer(tmp_path, tying_strategy="none", max_steps=2)
    trainer.train()
    trainer.save_state()
    before = (tmp_path / "trainer_state.json").read_text()

    def killed_half_way(state, path):
        with open(path, "w") as file:
            file.write(before[: len(before) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.TrainerState, "save_to_json", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_state()
    assert (tmp_path / "trainer_state.json").read_text() == before and finished_training_step(tmp_path, 2) == 2


class NaNAtCall:
    """Fault injection: a hook that makes its value NaN in its `call`-th call (from 1): as a forward hook on the
    language-model head, NaN logits (a NaN loss); as a gradient hook, a NaN gradient under a finite loss, as float16
    weights overflowing in the backward pass give."""

    def __init__(self, call):
        self.call, self.calls = call, 0

    def __call__(self, *arguments):
        self.calls += 1
        value = arguments[-1]  # a forward hook's output, a gradient hook's gradient
        return value * float("nan") if self.calls == self.call else value


def assert_only_checkpoint_2_of_finite_weights(trainer, output_dir) -> None:
    """The run stopped before step 3's update: checkpoint-2 alone, finite, and the model's weights are its."""
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == ["checkpoint-2"]
    saved, current = load_file(output_dir / "checkpoint-2" / "model.safetensors"), trainer.model.state_dict()
    assert all(torch.isfinite(tensor).all() and torch.equal(current[name], tensor) for name, tensor in saved.items())


def train_into_a_non_finite_step_3(output_dir, model, strategy, **settings) -> tuple[TyingTrainer, str]:
    """Train `model` for 4 steps, saving every 2 (DLT deciding every 4), into a fault injected in step 3: the trainer
    and the error it stopped with."""
    schedule = {"tying_interval": 4} if strategy == "dlt" else {}
    trainer = make_trainer(
        output_dir, model=model, tying_strategy=strategy, **schedule, max_steps=4, save_strategy="steps", save_steps=2,
        **settings,
    )  # fmt: skip
    with pytest.raises(FloatingPointError) as error:
        trainer.train()
    return trainer, str(error.value)


def stopped_in_step_3(what: str, output_dir) -> str:
    return (
        f"the {what} in step 3: training stopped before that step's update, so the weights are those after step 2 "
        f"and nothing was saved from them. To go on, resume from the last checkpoint, {output_dir / 'checkpoint-2'}, "
        "with a lower learning_rate (this run: 0.001) or a longer warm-up"
    )


@pytest.mark.parametrize("strategy", ["dlt", "none"])
def test_a_non_finite_loss_stops_training_before_its_update_and_leaves_the_checkpoint(tmp_path, strategy):
    model = tiny_model()
    # Two micro-batches per step; the first of step 3 (forward 5) is NaN: the run must stop before step 3's update.
    injection = NaNAtCall(call=5)
    model.lm_head.register_forward_hook(injection)
    trainer, error = train_into_a_non_finite_step_3(tmp_path, model, strategy, gradient_accumulation_steps=2)

    assert error == stopped_in_step_3("training loss is not finite (NaN or inf)", tmp_path)
    assert injection.calls == 6  # the flag is read once the step's micro-batches are done, before its update
    assert_only_checkpoint_2_of_finite_weights(trainer, tmp_path)


@pytest.mark.parametrize("strategy", ["dlt", "none"])
def test_a_finite_loss_with_a_non_finite_gradient_stops_training_before_its_update(tmp_path, strategy):
    model = tiny_model()
    model.transformer.wte.weight.register_hook(NaNAtCall(call=3))  # the embedding: no re-tie replaces it
    trainer, error = train_into_a_non_finite_step_3(tmp_path, model, strategy)

    assert error == stopped_in_step_3("gradient norm is not finite (nan)", tmp_path)
    assert_only_checkpoint_2_of_finite_weights(trainer, tmp_path)


@pytest.mark.slow
def test_a_non_finite_loss_on_one_rank_stops_every_rank_at_that_step(tmp_path):
    from helpers.processes import REPO, launch

    launch([str(REPO / "tests" / "scripts" / "ddp_nan_run.py"), str(tmp_path)], cwd=tmp_path)
    for rank in (0, 1):
        stopped_with = (tmp_path / f"stopped{rank}.txt").read_text()
        assert stopped_with.startswith("the training loss is not finite (NaN or inf) in step 3")
    assert sorted(path.name for path in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]


@pytest.mark.slow
@pytest.mark.parametrize("failing, step", [("decide", 2), ("finish", 8)])
def test_a_strategy_failing_on_the_main_process_stops_the_other_ranks_under_a_bare_launch(tmp_path, failing, step):
    from helpers.processes import REPO, free_port

    script = REPO / "tests" / "scripts" / "ddp_decision_failure_run.py"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), failing],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [process.communicate(timeout=180)[0] for process in ranks]
    except subprocess.TimeoutExpired:
        for process in ranks:
            process.kill()
        pytest.fail("a rank did not stop within 180 s of the main process's failure")
    assert [process.returncode for process in ranks] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert (tmp_path / "stopped0.txt").read_text() == f"ValueError: the agent failed in {failing}"
    assert (tmp_path / "stopped1.txt").read_text() == (
        f"RuntimeError: Process 0 stopped at step {step} with ValueError: the agent failed in {failing}; process 1 "
        "stops with it (the traceback is in process 0's output)"
    )


def test_tying_strategy_on_a_model_without_tied_blocks_is_rejected(tmp_path):
    plain = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=100, n_positions=32))
    with pytest.raises(ValueError, match="tying_strategy='dlt' needs a model with tied blocks"):
        make_trainer(tmp_path, model=plain)
    make_trainer(tmp_path, model=plain, tying_strategy="none")  # conventional training is fine


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(tying_strategy="static:cycle:9"), "cycle:9.*exceeds the 4 blocks"),
        (dict(tying_initial_map="0 0 1"), "tying_initial_map='0 0 1' does not fit the model.*3 entries"),
        (dict(tying_initial_map="0 2 0 0"), r"tying_initial_map.*tying_map\[1\] = 2 is a forward reference"),
    ],
)
def test_maps_that_do_not_fit_the_model_are_rejected_at_construction(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_trainer(tmp_path, **overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(tying_interval=0), "tying_interval must be an integer >= 1"),
        (dict(tying_initial_map="bogus"), "tying_initial_map='bogus': unknown tying strategy 'bogus'"),
        (dict(tying_interval=2.5), "tying_interval must be an integer >= 1 .*got 2.5"),
        (dict(tying_interval=True), "tying_interval must be an integer >= 1 .*got True"),
        (dict(tying_interval="5"), "tying_interval must be an integer >= 1 .*got '5'"),
        (dict(epsilon_start=1.5), r"epsilon_start must be a number in \[0.0, 1.0\], got 1.5"),
        (dict(epsilon_decay=0.9), "epsilon_decay is only used by dlt_variant 'paper', not 'default'"),
        (dict(q_gamma=-0.1), r"q_gamma must be a number in \[0.0, 1.0\], got -0.1"),
        (dict(q_forgetting=2.0), "q_forgetting must be a number in"),
        (dict(agent_seed=2**70), r"agent_seed must be an integer \(and below 2\*\*63\)"),
        (dict(max_distinct_blocks=0), "max_distinct_blocks must be an integer >= 1"),
        (dict(reward_block_cost=-1.0), r"reward_block_cost must be a number in \[0.0, inf\), got -1.0"),
        (dict(dlt_variant="clever"), "dlt_variant must be one of 'default', 'paper', got 'clever'"),
        (dict(reward_source="test"), "reward_source='test': expected 'train' or 'held_out'"),
        (dict(reward_kind="accuracy"), "reward_kind must be one of 'negative_loss', 'clipped_negative_perplexity', got 'accuracy'"),
        (dict(dlt_variant="paper", commit_after_exploration=True), "commit_after_exploration needs dlt_variant='default'"),
        (dict(tying_strategy="random", commit_after_exploration=True), "'random' does not read commit_after_exploration"),
        (dict(tying_strategy="static"), "needs an argument"),
        (dict(tying_strategy="static:bogus"), "unknown tying strategy 'bogus'"),
        (dict(tying_strategy="static:0,2"), r"tying_map\[1\] = 2 is a forward reference"),
        (dict(tying_strategy="similarity:x"), "similarity needs the number of distinct blocks"),
        (dict(tying_strategy="similarity:２"), "similarity needs the number of distinct blocks"),
        (dict(tying_strategy="learned"), "tying_strategy='learned'"),
        (dict(tying_strategy=None), "tying_strategy must be a string, got None"),
        (dict(tying_strategy=["dlt"]), r"tying_strategy must be a string, got \['dlt'\]"),
        (dict(tying_strategy="none", tying_initial_map="all"), "tying_strategy='none' does not read tying_initial_map"),
        # Settings the chosen strategy never reads are refused, not ignored.
        (dict(tying_strategy="none", q_gamma=0.5), "tying_strategy='none' does not read q_gamma: leave it unset"),
        (dict(tying_strategy="static:all", epsilon_start=0.5), "'static:all' does not read epsilon_start"),
        (dict(tying_strategy="static:all", tying_interval=3), "'static:all' does not read tying_interval"),
        (dict(tying_strategy="similarity:2", reward_source="held_out"), "'similarity:2' does not read reward_source"),
        (dict(tying_strategy="random", q_ridge=3.0), r"'random' does not read q_ridge: leave it unset \(it reads tying_interval"),
        (dict(reward_batch_size=8), "reward_batch_size is only read with reward_source='held_out'"),
        # max_distinct_blocks is dlt's and random's cap: similarity:U and static maps fix their own.
        (dict(tying_strategy="similarity:3", max_distinct_blocks=2), "'similarity:3' does not read max_distinct_blocks"),
        (dict(tying_strategy="static:all", max_distinct_blocks=2), "'static:all' does not read max_distinct_blocks"),
        # A similarity warm-up as long as the run would never tie.
        (dict(tying_strategy="similarity:2", similarity_warmup_steps=50, max_steps=12), "similarity_warmup_steps=50 is not below the run's 12"),
        (dict(tying_strategy="similarity:2", similarity_warmup_steps=12, max_steps=12), "would never be tied"),
    ],
)
def test_invalid_arguments_fail_at_construction_naming_the_argument(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tying_args(tmp_path, **overrides)


def test_a_warm_up_as_long_as_an_epoch_based_run_is_refused_before_training(tmp_path):
    trainer = make_trainer(tmp_path, tying_strategy="similarity:2", max_steps=-1, num_train_epochs=1, similarity_warmup_steps=16)
    with pytest.raises(ValueError, match="similarity_warmup_steps=16 is not below the run's 16 optimizer steps"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_the_settings_a_strategy_reads_get_their_defaults_and_the_others_stay_unset(tmp_path):
    static = tying_args(tmp_path, tying_strategy="static:all")
    assert all(getattr(static, name) is None for name in static.strategy_settings() if name != "tie_init")
    assert static.tie_init == "root"
    similarity = tying_args(tmp_path, tying_strategy="similarity:2")
    assert similarity.similarity_warmup_steps == 0 and similarity.tying_interval is None
    dlt = TyingTrainingArguments(output_dir=str(tmp_path), seed=7)
    assert (dlt.tying_interval, dlt.reward_source, dlt.reward_block_cost, dlt.agent_seed) == (15, "train", 0.0, 7)
    assert dlt.reward_batch_size is None and dlt.similarity_warmup_steps is None
    held_out = TyingTrainingArguments(output_dir=str(tmp_path), reward_source="held_out")
    assert held_out.reward_batch_size == 16


def test_a_held_out_reward_without_held_out_data_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="reward_source='held_out' needs held-out data for the reward"):
        TyingTrainer(model=tiny_model(), args=tying_args(tmp_path, reward_source="held_out"), train_dataset=token_dataset())


def test_reward_data_that_would_be_ignored_or_has_no_length_is_refused_naming_it(tmp_path):
    data = token_dataset()
    with pytest.raises(ValueError, match="reward_dataset is read only with reward_source='held_out', and this run's is 'train'"):
        TyingTrainer(model=tiny_model(), args=tying_args(tmp_path), train_dataset=data, reward_dataset=data)
    with pytest.raises(ValueError, match="reward_dataset \\(or eval_dataset\\) is a stream: .*split_reward_examples"):
        TyingTrainer(
            model=tiny_model(), args=tying_args(tmp_path, reward_source="held_out"), train_dataset=data,
            reward_dataset=data.to_iterable_dataset(),
        )  # fmt: skip


def test_model_card_settings_the_card_cannot_take_are_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="model_card_kwargs: dataset, model_name cannot be set; the card takes dataset_names, base_model"):
        make_trainer(tmp_path, model_card_kwargs={"dataset": "wikitext", "model_name": "mine"})


def test_decisions_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = make_trainer(tmp_path, max_steps=6, report_to=["tensorboard"])
    trainer.train()
    (run_dir,) = (tmp_path / "runs").iterdir()  # TensorBoardCallback's default: output_dir/runs/<date_host>
    events = EventAccumulator(str(run_dir))
    events.Reload()
    distinct = events.Scalars("train/tying/distinct_blocks")  # the callback prefixes "train/"
    assert [event.step for event in distinct][:3] == [0, 2, 4]
    assert [event.value for event in distinct][:3] == [record["distinct_blocks"] for record in trainer.tying_records]
    assert "train/tying/reward" in events.Tags()["scalars"]


def test_a_full_disk_during_a_checkpoint_names_the_folder_and_the_checkpoint_to_resume_from(tmp_path, monkeypatch):
    save = torch.save
    calls = []

    def disk_full_on_the_second_checkpoint(obj, path, *args, **kwargs):
        calls.append(str(path))
        if "checkpoint-4" in str(path):  # what torch reports for a full disk, without saying so
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 512 vs 396")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_on_the_second_checkpoint)
    trainer = make_trainer(tmp_path, max_steps=6, save_strategy="steps", save_steps=2)
    with pytest.raises(RuntimeError) as error:
        trainer.train()
    message = str(error.value)
    assert message.startswith(f"could not write {tmp_path / 'checkpoint-4'} (") and "the disk may be full" in message
    assert f"re-run the same command: it resumes from {tmp_path / 'checkpoint-2'}, the last complete checkpoint" in message
    assert "unexpected pos 512 vs 396" in message  # the original error is kept

    monkeypatch.setattr(torch, "save", save)
    resumed = make_trainer(tmp_path, max_steps=6, save_strategy="steps", save_steps=2)
    from hf_layertie.trainer.checkpoint_format import last_complete_checkpoint

    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    assert resumed.train(resume_from_checkpoint=str(last_complete_checkpoint(tmp_path))).global_step == 6


def test_with_a_checkpoint_limit_a_crash_before_the_tying_state_keeps_the_last_complete_checkpoint(tmp_path, monkeypatch):
    # The Trainer rotates old checkpoints out at the end of its part of a checkpoint; the tying state, which makes a
    # checkpoint complete, comes after it. With save_total_limit=1 a crash between the two left none complete.
    save = torch.save

    def crash_at_the_second_tying_state(obj, path, *args, **kwargs):
        if "checkpoint-4" in str(path) and "tying_state" in str(path):
            raise RuntimeError("killed")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", crash_at_the_second_tying_state)
    overrides = dict(max_steps=6, save_strategy="steps", save_steps=2, save_total_limit=1)
    with pytest.raises(RuntimeError, match=rf"it resumes from {re.escape(str(tmp_path / 'checkpoint-2'))}"):
        make_trainer(tmp_path, **overrides).train()

    monkeypatch.setattr(torch, "save", save)
    from hf_layertie.trainer.checkpoint_format import last_complete_checkpoint

    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    resumed = make_trainer(tmp_path, **overrides)
    assert resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2")).global_step == 6
    assert sorted(path.name for path in tmp_path.glob("checkpoint-*")) == ["checkpoint-6"]  # the limit still holds


@pytest.mark.parametrize(
    "length, as_path",
    [(dict(max_steps=12), False), (dict(max_steps=12), True), (dict(max_steps=-1, num_train_epochs=0.75), False)],
    ids=["max_steps", "max_steps, a Path", "by epochs"],  # 64 rows of 4 a step: 0.75 epochs are 12 steps
)
def test_a_checkpoint_at_max_steps_is_finished_from_without_a_step_more(tmp_path, length, as_path):
    overrides = dict(**length, save_strategy="steps", save_steps=4, lr_scheduler_type="constant")
    uninterrupted = make_trainer(tmp_path / "full", **overrides)
    uninterrupted.train()

    finished = make_trainer(tmp_path / "finished", **overrides)
    last = tmp_path / "full" / "checkpoint-12"
    result = finished.train(resume_from_checkpoint=last if as_path else str(last))

    assert result.global_step == finished.state.global_step == 12
    assert finished.tying_records == uninterrupted.tying_records  # the last decision rewarded as in the full run
    assert len(finished.tying_records) == 6
    for name, tensor in uninterrupted.model.state_dict().items():
        assert torch.equal(finished.model.state_dict()[name], tensor), name
    history = (tmp_path / "finished" / TYING_HISTORY_NAME).read_text().splitlines()
    assert [json.loads(line) for line in history] == uninterrupted.tying_records


def test_model_init_is_refused_where_the_strategy_ties_the_model_it_was_given(tmp_path):
    """`Trainer.train` would replace the model the strategy tied with a fresh one from `model_init`."""
    data = token_dataset()
    with pytest.raises(ValueError, match=r"TyingTrainer takes model=\.\.\., not model_init, with tying_strategy='static:cycle:2'"):
        TyingTrainer(model_init=tiny_model, args=tying_args(tmp_path, tying_strategy="static:cycle:2"), train_dataset=data)
    plain = TyingTrainer(model_init=lambda: tiny_model(), args=tying_args(tmp_path, tying_strategy="none", max_steps=2), train_dataset=data)
    assert plain.train().global_step == 2  # conventional training has no map to lose


@pytest.mark.parametrize("strategy", ["dlt", "random"])
def test_a_deciding_strategy_on_a_one_block_model_is_refused_naming_the_setting(tmp_path, strategy):
    with pytest.raises(ValueError, match=rf"tying_strategy='{strategy}' decides.* the model has 1 block: .*tying_strategy='none'"):
        make_trainer(tmp_path, model=tiny_model(num_blocks=1), tying_strategy=strategy, max_steps=2)


def test_auto_find_batch_size_is_refused_where_the_map_changes(tmp_path):
    """On running out of memory the Trainer restarts at step 0 with half the batch, the map and decisions not."""
    with pytest.raises(ValueError, match=r"auto_find_batch_size=True would restart training at step 0.*tying_strategy='dlt'"):
        make_trainer(tmp_path, tying_strategy="dlt", auto_find_batch_size=True)
    assert make_trainer(tmp_path, tying_strategy="static:cycle:2", auto_find_batch_size=True, max_steps=2).train().global_step == 2


def test_a_save_into_a_folder_an_abandoned_run_left_is_not_complete_until_its_own_tying_state(tmp_path, monkeypatch):
    """A run resumed from an earlier checkpoint saves again into `checkpoint-N` folders its first run left: killed
    while saving, that folder must not pass for complete with the first run's tying state."""
    trainer = make_trainer(tmp_path, tying_strategy="dlt", max_steps=2, save_strategy="steps", save_steps=2)
    stale = tmp_path / "checkpoint-2" / TYING_STATE_NAME
    stale.parent.mkdir()
    stale.write_bytes(b"the abandoned run's")

    def killed_while_saving(self, model, trial):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", killed_while_saving)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert not stale.exists()


def test_a_best_checkpoint_deleted_before_the_end_leaves_the_last_weights_as_the_trainer_does(tmp_path):
    class DeleteCheckpoints(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 4:
                for folder in tmp_path.glob("checkpoint-*"):
                    shutil.rmtree(folder)

    settings = dict(max_steps=4, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2)
    best = dict(load_best_model_at_end=True, metric_for_best_model="eval_loss")
    trainer = make_trainer(tmp_path, callbacks=[DeleteCheckpoints()], tying_strategy="dlt", **settings, **best)
    trainer.train()
    assert trainer.state.best_model_checkpoint is not None and not (tmp_path / "checkpoint-2").exists()
    assert trainer.model.tying_map.to_list() == trainer.tying_records[-1]["map"]  # the map the run ended on


def test_trainer_card_arguments_the_tied_card_cannot_take_are_named_in_a_warning(tmp_path, caplog):
    trainer = make_trainer(tmp_path, tying_strategy="static:cycle:2", max_steps=1)
    trainer.train()
    trainer.create_model_card(license="mit", tags=["mine"], model_name="org/model")
    assert "the hf-layertie card does not take license, tags" in caplog.text
    assert (tmp_path / "README.md").is_file()


def test_a_tying_state_without_its_loss_window_is_refused_naming_the_key(tmp_path):
    trainer = make_trainer(tmp_path, tying_strategy="dlt", max_steps=2)
    observation = trainer.engine.observation()
    state = trainer.decisions.state_dict(observation)
    del state["window_loss_sums"]
    with pytest.raises(ValueError, match=r"tying state is missing \['window_loss_sums'\]"):
        trainer.decisions.load_state_dict(state, observation)


def test_deepspeed_is_refused_for_tied_models_naming_what_works():
    from hf_layertie.trainer.guards import refuse_engine

    with pytest.raises(ValueError, match=r"not train tied models under DeepSpeed.*accelerate launch --multi_gpu.*shard_tied_model"):
        refuse_engine(tiny_model(), "DeepSpeed", enabled=True)
    refuse_engine(tiny_model(), "DeepSpeed", enabled=False)
    refuse_engine(torch.nn.Linear(2, 2), "DeepSpeed", enabled=True)  # a model with nothing tied trains as usual


def test_a_resume_brings_an_optimizer_passed_in_along_to_the_checkpoint_s_map(tmp_path):
    """An optimizer given in `optimizers` holds the starting map's Parameters; resuming re-ties the model to the
    checkpoint's map, and the optimizer must follow before the checkpoint's optimizer state is loaded into it."""
    from hf_layertie.trainer.checkpoint_format import checkpoint_tying_map

    def trainer(model, optimizer, **overrides):
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        args = tying_args(tmp_path, **{"max_steps": 6, **overrides})
        return TyingTrainer(model=model, args=args, train_dataset=token_dataset(), optimizers=(optimizer, scheduler))

    first = tiny_model()
    trainer(first, torch.optim.AdamW(first.parameters(), lr=1e-3), max_steps=4, save_strategy="steps", save_steps=4).train()
    saved_map = checkpoint_tying_map(tmp_path / "checkpoint-4", 4)
    assert saved_map.num_distinct > 1  # dlt starts with every block tied to block 0: the resume re-ties

    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert trainer(model, optimizer).train(resume_from_checkpoint=str(tmp_path / "checkpoint-4")).global_step == 6
    held = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    assert held == [parameter for parameter in model.parameters() if parameter.requires_grad]


def test_resume_from_checkpoint_true_skips_a_checkpoint_a_crash_left_incomplete(tmp_path, caplog):
    make_trainer(tmp_path, max_steps=4, save_strategy="steps", save_steps=2).train()
    (tmp_path / "checkpoint-4" / TYING_STATE_NAME).unlink()  # a crash before the tying state, written last
    resumed = make_trainer(tmp_path, max_steps=6, save_strategy="steps", save_steps=2)
    with caplog.at_level("WARNING"):
        assert resumed.train(resume_from_checkpoint=True).global_step == 6
    assert f"Skipping {tmp_path / 'checkpoint-4'}: an interrupted save left it without {TYING_STATE_NAME}" in caplog.text

    empty = tmp_path / "empty"
    with pytest.raises(ValueError, match=f"resume_from_checkpoint=True: no complete checkpoint in {re.escape(str(empty))}"):
        make_trainer(empty, max_steps=2).train(resume_from_checkpoint=True)


def test_only_an_error_that_reads_as_a_full_disk_is_blamed_on_the_disk(tmp_path):
    """Every error raised while writing a checkpoint names the folder and the way on; a device error is not said to
    be a full disk, nor a folder without write permission."""
    import errno

    from hf_layertie.trainer.checkpoint_format import explain_write_errors

    folder = tmp_path / "checkpoint-2"
    for error, full in (
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 512 vs 396"), True),
        (PermissionError(errno.EACCES, "Permission denied"), False),
        (RuntimeError("CUDA error: device-side assert triggered"), False),
    ):
        with pytest.raises(type(error)) as raised:
            with explain_write_errors(folder):
                raise error
        message = str(raised.value)
        assert message.startswith(f"could not write {folder} (") and str(error) in message
        assert ("the disk may be full" in message) == full and "no checkpoint is complete yet" in message


def test_a_re_tie_keeps_the_optimizer_s_parameters_from_outside_the_model():
    """A Parameter the user's optimizer trains beside the model (a learnable loss weight) stays in its group through
    re-ties; the model's own follow the map."""
    from hf_layertie.engine.optimizer_sync import sync_optimizer_with_model

    model = tiny_model()
    loss_weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.AdamW([{"params": list(model.parameters())}, {"params": [loss_weight], "lr": 0.1}])
    for new_map in ([0, 0, 2, 2], [0, 1, 1, 3], [0, 0, 0, 0]):
        sync_optimizer_with_model(optimizer, model, model.retie(new_map))
        assert optimizer.param_groups[0]["params"] == list(model.parameters())
        assert optimizer.param_groups[1]["params"] == [loss_weight]


def test_with_the_best_model_loaded_at_the_end_the_last_reward_and_a_finish_from_match_a_run_without_it(tmp_path):
    """The last decision is rewarded on the weights it led to, before the Trainer loads the best checkpoint, as in a
    run that loads nothing; and finishing from the final checkpoint ends on the best model, as the run did."""
    settings = dict(
        max_steps=6, reward_source="held_out", reward_batch_size=8, eval_strategy="steps", eval_steps=2,
        save_strategy="steps", save_steps=2,
    )  # fmt: skip
    best = dict(load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=True)  # an early one
    plain = make_trainer(tmp_path / "plain", **settings)
    plain.train()
    loaded = make_trainer(tmp_path / "loaded", **settings, **best)
    loaded.train()
    assert loaded.state.best_model_checkpoint != str(tmp_path / "loaded" / "checkpoint-6")
    assert loaded.tying_records == plain.tying_records
    loaded.save_model()  # its card gives the loss of the model saved (the best), not the last evaluation's
    losses = {entry["step"]: entry["eval_loss"] for entry in loaded.state.log_history if "eval_loss" in entry}
    assert round(losses[loaded.state.best_global_step], 4) != round(losses[6], 4)
    assert f"| evaluation set | eval_loss | {round(losses[loaded.state.best_global_step], 4)} |" in (tmp_path / "loaded" / "README.md").read_text()

    finished = make_trainer(tmp_path / "loaded", model=tiny_model(seed=3), **settings, **best)
    finished.train(resume_from_checkpoint=str(tmp_path / "loaded" / "checkpoint-6"))
    assert finished.model.tying_map == loaded.model.tying_map
    for (name, ours), theirs in zip(finished.model.state_dict().items(), loaded.model.state_dict().values()):
        assert torch.equal(ours, theirs), name
