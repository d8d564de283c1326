"""Looped models' depth schedules in training (`loop_onset`, `loop_schedule`): which positions each step computes,
exact resume across the switch, and the settings' refusals."""

import pytest
from helpers.training import assert_resuming_equals_the_uninterrupted_run, make_trainer, tiny_model

from hf_layertie import TyingTrainingArguments
from hf_layertie.models import TyingMap
from hf_layertie.trainer.loop_schedule import skipped_over_training, skipped_positions_at


def test_occurrences_and_the_positions_each_schedule_skips():
    looped = TyingMap([0, 1, 0, 1, 0, 1])  # cycle:2 over 6 positions: three passes
    assert looped.occurrences() == [0, 0, 1, 1, 2, 2]
    assert TyingMap([0, 1, 1, 1]).occurrences() == [0, 0, 1, 2]
    # onset at 0.5 of 12 steps: steps 0-5 skip every repeated position, from step 6 none.
    assert [skipped_positions_at(step, 12, looped, 0.5, "onset") for step in (0, 5, 6, 11)] == [[2, 3, 4, 5], [2, 3, 4, 5], None, None]
    # progressive: one pass in steps 0-1, two in 2-3, three in 4-5, then all (the same).
    progressive = [skipped_positions_at(step, 12, looped, 0.5, "progressive") for step in range(7)]
    assert progressive == [[2, 3, 4, 5], [2, 3, 4, 5], [4, 5], [4, 5], None, None, None]
    assert skipped_positions_at(0, 12, TyingMap([0, 1, 2, 3]), 0.5, "onset") is None  # no loop: nothing to skip


class BlockCalls:
    """Counts the forward calls of one block position, per optimizer step of the trainer it is given."""

    def __init__(self):
        self.steps: list[int] = []
        self.trainer = None

    def __call__(self, module, args):
        if module.training:
            self.steps.append(self.trainer.state.global_step)


@pytest.mark.parametrize("schedule, computed_from", [("onset", {2: 3, 3: 3}), ("progressive", {2: 1, 3: 2})])
def test_repeated_positions_compute_from_the_step_their_schedule_says(tmp_path, schedule, computed_from):
    """`0 1 1 1`, 6 steps, onset at 0.5 (step 3): position 1 always computes; 2 and 3 from step 3 (`onset`), or from
    steps 1 and 2 (`progressive`: one pass in step 0, two in step 1, three in step 2)."""
    model = tiny_model()
    calls = {position: BlockCalls() for position in (1, 2, 3)}
    for position, counter in calls.items():
        model.transformer.h[position].register_forward_pre_hook(counter)
    trainer = make_trainer(
        tmp_path, model=model, tying_strategy="static:0,1,1,1", max_steps=6, loop_onset=0.5, loop_schedule=schedule
    )
    for counter in calls.values():
        counter.trainer = trainer
    trainer.train()
    assert sorted(set(calls[1].steps)) == list(range(6))
    for position, first in computed_from.items():
        assert sorted(set(calls[position].steps)) == list(range(first, 6)), (position, calls[position].steps)
    assert trainer.model.config.skipped_positions is None  # the trained model computes every position


def test_a_run_resumed_before_the_switch_equals_the_uninterrupted_run(tmp_path):
    settings = dict(tying_strategy="static:0,1,1,1", max_steps=6, loop_onset=0.5, save_strategy="steps", save_steps=2)
    assert_resuming_equals_the_uninterrupted_run(tmp_path, settings, resume_step=2)  # the switch comes at step 3


@pytest.mark.parametrize("saved, given, message", [
    (dict(loop_onset=0.5), dict(loop_onset=0.25), r"loop_onset=0\.5 there, 0\.25 here"),
    (dict(loop_lr_exponent=1.0), {}, r"loop_lr_exponent=1\.0 there, None here"),
])  # fmt: skip
def test_a_resumed_run_must_repeat_the_loop_settings(tmp_path, saved, given, message):
    settings = dict(tying_strategy="static:0,1,1,1", max_steps=4, save_strategy="steps", save_steps=2)
    make_trainer(tmp_path / "run", **settings, **saved).train()
    with pytest.raises(ValueError, match=message):
        make_trainer(tmp_path / "again", **settings, **given).train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(loop_onset=1.0), r"loop_onset must be a fraction of max_steps in \(0, 1\), got 1\.0"),
        (dict(loop_onset=0.3, loop_schedule="sometimes"), r"loop_schedule must be one of onset, progressive, got 'sometimes'"),
        (dict(loop_schedule="progressive"), r"loop_schedule='progressive' only applies with loop_onset"),
    ],
)
def test_loop_settings_are_checked_naming_the_setting(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        TyingTrainingArguments(output_dir=str(tmp_path), **settings)


def test_a_model_that_skips_positions_of_its_own_is_not_given_a_schedule(tmp_path):
    model = tiny_model()
    model.config.skipped_positions = [3]
    with pytest.raises(ValueError, match=r"the model's config skips \[3\] already"):
        make_trainer(tmp_path, model=model, tying_strategy="static:0,1,1,1", max_steps=4, loop_onset=0.5)


def test_the_plot_s_skips_follow_the_map_in_force_at_each_step():
    """A map that changes at step 4 (`0 0 0 0` to `0 1 1 1`) before an onset at step 6: positions 1-3 are repeats
    first, 2-3 after; the change points are recomputed from the history alone."""
    records = [{"step": 0, "map": [0, 0, 0, 0]}, {"step": 4, "map": [0, 1, 1, 1]}]
    assert skipped_over_training(records, 12, 12, 0.5, "onset") == [
        {"step": 0, "skipped": [1, 2, 3]}, {"step": 4, "skipped": [2, 3]}, {"step": 6, "skipped": None},
    ]  # fmt: skip
    assert skipped_over_training(records, 3, 12, 0.5, "onset") == [{"step": 0, "skipped": [1, 2, 3]}]  # stopped early
    assert skipped_over_training(records, 12, 12, None, None, fixed=[3]) == [{"step": 0, "skipped": [3]}]
    assert skipped_over_training(records, 12, 12, None, None) == []


@pytest.mark.parametrize("loop_onset, grey", [(0.5, True), (None, False)])
def test_the_tying_plot_greys_the_positions_a_run_skipped(tmp_path, loop_onset, grey):
    import matplotlib.image

    trainer = make_trainer(tmp_path, tying_strategy="static:0,1,1,1", max_steps=4, loop_onset=loop_onset)
    trainer.train()
    trainer.save_model()
    image = matplotlib.image.imread(tmp_path / "tying_map.png")[..., :3]
    light_grey = (abs(image - 211 / 255) < 0.01).all(axis=-1)  # matplotlib's "lightgrey", #d3d3d3
    assert bool(light_grey.sum() > 1000) is grey
