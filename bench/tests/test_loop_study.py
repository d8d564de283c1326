"""Issue 76's pre-registered loop study (bench/loop_study.py, presets `loops-*`): the runs are the pre-registration's
rows and nothing else, each task's settings come from the file and not from flags, and no run starts before the
file is committed as it is."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # `bench` is a folder of the repository, not part of the installed package

from bench.loop_report import (  # noqa: E402
    HYPOTHESIS_CONTRASTS,
    _bearing_rows_finished,
    _settled_by,
    decide,
    departures,
    loop_study_markdown,
)
from bench.loop_study import PREREGISTRATION, read_preregistration, registration_commit, task_rows  # noqa: E402
from bench.settings import (  # noqa: E402
    PRESETS,
    BenchArguments,
    independent_runs,
    memory_runs,
    plan_contrasts,
    preregistered,
    resolve_settings,
)
from hf_layertie import resolve_tying_map  # noqa: E402

REGISTRATION = read_preregistration()
LOOP_PRESETS = [name for name, settings in PRESETS.items() if settings.loop_study is not None]
# The presets the pre-registration names; the other loops presets (loops-language-gpu) train a registered task
# otherwise, and their pages say how (test_a_folder_trained_off_the_registered_settings_names_each_departure).
REGISTERED_PRESETS = [plan["preset"] for plan in REGISTRATION["tasks"].values()]


def test_every_task_of_the_pre_registration_has_its_preset_and_every_loops_preset_a_task():
    for task, plan in REGISTRATION["tasks"].items():
        assert PRESETS[plan["preset"]].loop_study == task
    assert {PRESETS[name].loop_study for name in LOOP_PRESETS} == set(REGISTRATION["tasks"])


@pytest.mark.parametrize("preset", REGISTERED_PRESETS)
def test_a_loops_preset_trains_the_registered_rows_at_the_registered_budget(preset):
    settings = resolve_settings(BenchArguments(preset=preset))
    plan = REGISTRATION["tasks"][settings.loop_study]
    assert settings.seeds == tuple(REGISTRATION["seeds"]) and len(settings.seeds) >= 10
    assert (settings.task, settings.n_layer, settings.max_distinct_blocks) == (plan["task"], plan["depth"], plan["budget"])
    runs = independent_runs(settings, settings.seeds[0])
    assert [spec.label for spec in runs] == [row.label for row in task_rows(REGISTRATION, settings.loop_study)]
    assert len({spec.directory for spec in runs}) == len(runs)  # no two rows share a run
    budget = plan["budget"]
    parts = REGISTRATION["recipe"]
    # The registered rows: U and 2U untied, each layout alone, under the whole recipe, under each part alone, with
    # the onset alone and with the recipe, and DLT under the recipe.
    assert len(runs) == 2 + len(plan["layouts"]) * (2 + len(parts) + 2) + 1
    by_label = {spec.label: spec for spec in runs}
    assert (by_label[f"untied, {budget} blocks"].num_blocks, by_label[f"untied, {2 * budget} blocks"].num_blocks) == (budget, 2 * budget)
    whole = {name: value for part in parts.values() for kind in ("tying", "config") for name, value in part.get(kind, {}).items()}
    onset = REGISTRATION["onset"]["tying"]
    for spec in runs:
        settings_of = dict(spec.tying) | dict(spec.looped_config)
        if spec.strategy.startswith("static:"):
            layout = resolve_tying_map(spec.strategy.removeprefix("static:"), spec.num_blocks)
            assert layout.num_distinct == budget and len(layout) > budget  # every layout loops U blocks
        if spec.strategy.startswith("static:") and spec.label.endswith(" + recipe"):
            assert settings_of == whole | (onset if "+ onset +" in spec.label else {})
        if spec.label == "dlt + recipe":  # a moving map takes every part but the adapters, which only fixed maps have
            assert spec.strategy == "dlt" and settings_of == {k: v for k, v in whole.items() if not k.startswith("lora_")}
    assert memory_runs(settings) == []
    contrasts = plan_contrasts(settings)
    assert all(other in by_label for versus in contrasts.values() for other in versus.values())


def test_the_pre_registration_fixes_the_language_margin_and_a_hypothesis_per_question():
    assert REGISTRATION["margin_nats"] == 0.05
    assert [key.split()[0] for key in REGISTRATION["hypotheses"]] == [f"H{number}" for number in range(1, 8)]


def test_a_loops_preset_trains_as_registered_and_takes_only_scheduling_flags():
    """Task, depth and budget come from the file, the rest from the preset as registered: a training flag is refused
    by name; registered seeds may be a subset, others train only into a folder of their own."""
    with pytest.raises(ValueError, match=r"--n_layer, --task: a loops preset trains as .*looped-models.json registered it"):
        resolve_settings(BenchArguments(preset="loops-hop", task="hop_induction:length=16,max_hops=2", n_layer=6))
    for flags in ({"learning_rate": 3e-3}, {"max_steps": 100}, {"lr_scheduler_type": "cosine"}, {"tying_interval": 2}):
        with pytest.raises(ValueError, match=f"--{next(iter(flags))}: a loops preset trains as"):
            resolve_settings(BenchArguments(preset="loops-language", **flags))
    assert resolve_settings(BenchArguments(preset="loops-hop", seeds="100,101", num_threads=2)).seeds == (100, 101)
    with pytest.raises(ValueError, match=r"--seeds: 0, 1 not registered .* only into a folder of their own \(--results_dir\)"):
        resolve_settings(BenchArguments(preset="loops-hop", seeds="0,1,100"))
    assert resolve_settings(BenchArguments(preset="loops-hop", seeds="0,1", results_dir="elsewhere")).seeds == (0, 1)
    settings = resolve_settings(BenchArguments(preset="loops-hop"))
    assert settings.preregistration_digest is not None and settings.preregistration_digest in settings.fingerprint()


def test_a_run_resolved_under_other_settings_than_its_folder_s_is_refused(tmp_path):
    """Each run re-resolves its settings (a pre-registration committed again meanwhile would change its digest): it
    trains only into a folder claimed under the same ones."""
    from bench.run_bench import single_run
    from bench.settings import RunSpec

    settings = resolve_settings(BenchArguments(preset="loops-hop"))
    claimed = dataclasses.replace(settings, preregistration_digest="0" * 16)
    (tmp_path / "settings.json").write_text(json.dumps({"fingerprint": claimed.fingerprint(), "baselines": {}}))
    with pytest.raises(SystemExit, match="holds runs measured with other settings"):
        single_run(settings, RunSpec("untied, 2 blocks", "none", 100, num_blocks=2), tmp_path)
    assert not (tmp_path / "study").exists()


def test_a_malformed_pre_registration_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "looped-models.json"
    broken = json.loads(PREREGISTRATION.read_text())
    broken["recipe"]["rate"] = {"tying": {"learning_rate": 0.1}}
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=r"recipe part 'rate' sets learning_rate under 'tying'; allowed: loop_lr_exponent"):
        read_preregistration(path)
    del broken["seeds"]
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match=r"the pre-registration has no 'seeds'"):
        read_preregistration(path)


def test_no_run_starts_before_its_pre_registration_is_committed_as_it_is(tmp_path):
    """Untracked, committed, then edited: only the committed, unedited file gives the commit every record names."""
    from bench.loop_study import preregistration_digest

    def git(*arguments):
        subprocess.run(["git", "-C", str(tmp_path), *arguments], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "study@example.com")
    git("config", "user.name", "study")
    path = tmp_path / "looped-models.json"
    path.write_text(PREREGISTRATION.read_text())
    digest = preregistration_digest("k-hop", path)
    with pytest.raises(ValueError, match="is not committed as it is now, with task 'k-hop' registered .* commit the pre-registration before"):
        registration_commit("k-hop", digest, path)
    git("add", path.name)
    git("commit", "-qm", "register")
    commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert registration_commit("k-hop", digest, path) == commit
    registration = json.loads(path.read_text())
    path.write_text(json.dumps(registration | {"margin_nats": 0.1}))
    with pytest.raises(ValueError, match="is not committed as it is now"):
        registration_commit("k-hop", digest, path)
    with pytest.raises(ValueError, match="is not committed as it is now"):  # nor under the edited file's own digest
        registration_commit("k-hop", preregistration_digest("k-hop", path), path)
    # Committed with the margin changed, the task's registration is another: its earlier settings are refused.
    git("commit", "-qam", "margin changed")
    with pytest.raises(ValueError, match="is not committed as it is now"):
        registration_commit("k-hop", digest, path)
    # Another task registered later leaves this one's registration standing.
    path.write_text(json.dumps(registration | {"tasks": registration["tasks"] | {"later": registration["tasks"]["k-hop"]}}))
    git("commit", "-qam", "a task added")
    assert preregistration_digest("k-hop", path) == digest
    assert registration_commit("k-hop", digest, path) != commit  # the file's latest commit, which holds it unchanged


def test_no_run_of_a_later_rival_starts_before_its_addendum_is_committed_as_it_is(tmp_path, monkeypatch):
    """An addendum (a later rival registered with a rule of its own) gives the commit its rival's records name only
    committed and unedited; run_bench.py refuses to start the rival otherwise, or at other rates, before claiming a
    folder; measure.py records the commit before training, and loop_compute.py reads it from the records, with no
    git history."""
    from bench import run_bench
    from bench import settings as settings_module
    from bench.loop_study import addendum_commit
    from bench.settings import _check

    rival, args = PRESETS["loops-language-steps"], BenchArguments(preset="loops-language-steps")

    def check_rival(args):  # run_bench's check of the preset, its addendum in the repository below
        with monkeypatch.context() as patched:
            patched.setattr(settings_module, "PREREGISTRATION", tmp_path / "looped-models.json")
            run_bench.check_registered(rival, args)

    def git(*arguments):
        return subprocess.run(["git", "-C", str(tmp_path), *arguments], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "study@example.com")
    git("config", "user.name", "study")
    path = tmp_path / "looped-language-compute.json"
    path.write_text((PREREGISTRATION.parent / "looped-language-compute.json").read_text())
    with pytest.raises(ValueError, match="looped-language-compute.json is not committed as it is now: commit the addendum before"):
        addendum_commit(path)
    with pytest.raises(SystemExit, match="looped-language-compute.json is not committed as it is now"):
        check_rival(args)
    git("add", path.name)
    git("commit", "-qm", "register the rival")
    assert addendum_commit(path) == git("rev-parse", "HEAD")
    check_rival(args)
    with pytest.raises(SystemExit, match="--tune_learning_rates: a pre-registered preset trains every row at its registered rate"):
        check_rival(dataclasses.replace(args, tune_learning_rates="1e-3,3e-3"))
    path.write_text(path.read_text().replace('"margin_nats": 0.05', '"margin_nats": 0.1'))
    with pytest.raises(ValueError, match="is not committed as it is now"):
        addendum_commit(path)
    with pytest.raises(ValueError, match="the preset's addendum 'nope.json': no such file in .*bench/preregistration"):
        _check(dataclasses.replace(rival, addendum="nope.json"))
    with pytest.raises(ValueError, match="a preset answers to the study \\('language'\\) or to an addendum \\('looped-language-compute.json'\\), not both"):
        _check(dataclasses.replace(rival, loop_study="language"))


def test_the_loops_presets_share_their_model_and_steps_with_the_studies_they_extend():
    """The depth tasks train depth's model and steps under the frozen recipe; language trains partial's."""
    for name in REGISTERED_PRESETS:
        settings, task = PRESETS[name], PRESETS[name].loop_study
        parent = PRESETS["partial"] if task == "language" else PRESETS["depth"]
        assert dataclasses.replace(settings, loop_study=None, seeds=parent.seeds, n_layer=parent.n_layer, partial_loops=parent.partial_loops,
                                   tuning_seed=parent.tuning_seed, frozen_recipe=parent.frozen_recipe) == parent  # fmt: skip


def test_the_word_problem_choice_takes_a_clear_win_on_every_choice_seed_and_the_highest_lower_bound_per_kind():
    from bench.loop_choice import _tests_depth, choose

    def difference(mean, half, seeds=5):
        return {"mean": mean, "half_width": half, "seeds": seeds, "verdict": "higher" if mean - half > 0 else "no difference detected"}

    assert _tests_depth(difference(0.08, 0.02))
    assert not _tests_depth(difference(0.04, 0.01))  # above 0, but not by 5 points
    assert not _tests_depth(difference(0.08, 0.09))  # the interval reaches 0
    assert not _tests_depth(difference(0.08, 0.02, seeds=4))  # a choice seed missing
    candidates = [
        {"task": "wide", "kind": "solvable", "tests_depth": True, "validation_difference": difference(0.20, 0.14)},
        {"task": "narrow", "kind": "solvable", "tests_depth": True, "validation_difference": difference(0.10, 0.02)},
        {"task": "flat", "kind": "non-solvable", "tests_depth": False, "validation_difference": difference(0.0, 0.01)},
    ]
    assert choose(candidates) == {"solvable": "narrow", "non-solvable": None}  # 0.08 above 0 beats 0.06


def _difference(verdict: str) -> dict:
    mean = {"lower": -0.05, "higher": 0.05}.get(verdict, 0.0)
    return {"mean": mean, "half_width": 0.02, "seeds": 10, "verdict": verdict}


@pytest.mark.parametrize(
    "number, contrasts, better, holds, by",
    [
        # H7, in loss: one looped row below 4 untied blocks is enough to reject it; level rows leave it standing.
        ("H7", [("a", "untied U", "lower"), ("b", "untied U", "no difference detected")], "lower", False, ["a"]),
        ("H7", [("a", "untied U", "higher"), ("b", "untied U", "no difference detected")], "lower", True, []),
        # H1 and H2, in accuracy: the row must be above, not merely level.
        ("H1", [("0 1 1 1", "untied U", "higher")], "higher", True, ["0 1 1 1"]),
        ("H2", [("cycle:2, 4 positions + recipe", "layout alone", "no difference detected")], "higher", False, ["cycle:2, 4 positions + recipe"]),
        # H3: one layout under the recipe not below the ceiling suffices.
        ("H3", [("a", "untied 2U", "lower"), ("b", "untied 2U", "no difference detected")], "higher", True, ["b"]),
        ("H3", [("a", "untied 2U", "lower")], "higher", False, ["a"]),
        # H4: a part above its layout alone and level with the whole recipe rejects it; below the recipe, it does not.
        ("H4", [("a + rate", "layout alone", "higher"), ("a + rate", "whole recipe", "no difference detected")], "higher", False, ["a + rate"]),
        ("H4", [("a + rate", "layout alone", "higher"), ("a + rate", "whole recipe", "lower")], "higher", True, []),
        # H5: any detected change rejects it.
        ("H5", [("a + onset", "layout alone", "no difference detected"), ("a + onset + recipe", "whole recipe", "lower")], "lower", False, ["a + onset + recipe"]),
        # H6: DLT above the better fixed layout rejects it.
        ("H6", [("dlt + recipe", "a + recipe", "higher")], "higher", False, ["dlt + recipe"]),
        # Nothing run yet: open.
        ("H1", [], "higher", None, []),
    ],
)  # fmt: skip
def test_each_hypothesis_is_decided_by_its_sentence_read_with_the_registered_interval_rule(number, contrasts, better, holds, by):
    outcome = decide(number, [(label, name, _difference(verdict)) for label, name, verdict in contrasts], better)
    assert (outcome["holds"], outcome["by"]) == (holds, by)
    # What the rows named decide, rows yet to run cannot undo: a refuted sentence, or H3 proved by the row it finds.
    assert outcome["by_rows_named"] == (holds is False if number != "H3" else holds is True)


@pytest.mark.parametrize(
    "number, contrasts, settled_by",
    [
        # One refuting row on every seed settles it, another still on 4 seeds does not undo it.
        ("H7", [("a", "untied U", "lower", 10), ("b", "untied U", "lower", 4)], ["a"]),
        ("H7", [("a", "untied U", "lower", 9), ("b", "untied U", "lower", 4)], []),
        # A row decides on every seed only when each of its contrasts has them.
        ("H4", [("a + rate", "layout alone", "lower", 10), ("a + rate", "whole recipe", "no difference detected", 7)], []),
        ("H4", [("a + rate", "layout alone", "lower", 10), ("a + rate", "whole recipe", "no difference detected", 10)], ["a + rate"]),
        # A sentence that holds so far rests on every row: rows yet to run could still refute it.
        ("H7", [("a", "untied U", "no difference detected", 10)], []),
    ],
)  # fmt: skip
def test_a_verdict_is_final_before_the_other_rows_once_a_row_that_decides_it_alone_has_every_seed(number, contrasts, settled_by):
    deciding = [(label, name, _difference(verdict) | {"seeds": seeds}) for label, name, verdict, seeds in contrasts]
    assert _settled_by(decide(number, deciding, better="lower"), deciding, registered_seeds=10) == settled_by


PLANNED = ["untied, 4 blocks", "a", "a + recipe", "a + rate", "a + residual", "a + onset", "dlt + recipe"]


@pytest.mark.parametrize(
    "number, paired_seeds, finished",
    [
        # H4 rests on the parts' rows alone: once each of their contrasts has every seed, the onset's does not matter.
        ("H4", {("a + rate", "layout alone"): 10, ("a + rate", "whole recipe"): 10, ("a + residual", "layout alone"): 10, ("a + residual", "whole recipe"): 10}, True),
        ("H4", {("a + rate", "layout alone"): 10, ("a + rate", "whole recipe"): 10, ("a + residual", "layout alone"): 10, ("a + residual", "whole recipe"): 9}, False),
        # A part's row not yet run bears on it: no.
        ("H4", {("a + rate", "layout alone"): 10, ("a + rate", "whole recipe"): 10}, False),
        # H7 bears on the onset's row too, which has not run.
        ("H7", {(label, "untied U"): 10 for label in ["a", "a + recipe", "a + rate", "a + residual"]}, False),
        # H6's contrast is chosen among rows on validation: never before every row has run.
        ("H6", {}, False),
    ],
)  # fmt: skip
def test_a_verdict_is_final_before_the_other_rows_once_every_row_that_bears_on_it_has_every_seed(number, paired_seeds, finished):
    contrasts = [(label, name, _difference("no difference detected") | {"seeds": seeds}) for (label, name), seeds in paired_seeds.items()]
    assert _bearing_rows_finished(number, PLANNED, contrasts, registered_seeds=10) is finished


def test_a_loop_report_calls_a_verdict_final_once_no_run_to_come_can_change_it():
    """The committed language report: H7's verdict names the rows below 4 untied blocks in its table, and it is final
    once one of them is paired on every registered seed (a "no row" sentence one row refutes stays refuted, whatever
    the rows still running show), naming the rows that make it so; with each of them a seed short it is interim. A
    verdict that needs every row stays interim until every row has every seed; then every verdict is final. The
    report is read with one run still to come (DLT's last seed, which bears on neither H4 nor H7), as it was while the
    study ran, whatever the committed records have reached since."""
    payload = json.loads((REPO_ROOT / "bench" / "reports" / "study" / "loops-language" / "results.json").read_text())
    payload["runs"] = {label: {int(seed): run for seed, run in by_seed.items()} for label, by_seed in payload["runs"].items()}
    del payload["runs"]["dlt + recipe"][max(payload["runs"]["dlt + recipe"])]
    settings = resolve_settings(BenchArguments(preset="loops-language"))

    def h7(payload: dict) -> str:
        return loop_study_markdown(settings, payload).split("**H7 language**")[1]

    below = [label for label, row in payload["rows"].items() if row["versus"].get("untied U", {}).get("verdict") == "lower" and not label.startswith("untied")]
    settled_by = [label for label in below if payload["rows"][label]["versus"]["untied U"]["seeds"] == len(REGISTRATION["seeds"])]
    expected = f"does not hold** ({'; '.join(below)})" if below else "holds**"
    assert f"**{'Verdict' if settled_by else 'Interim verdict'}: {expected}" in h7(payload)
    assert ("final before the other rows" in h7(payload)) is bool(settled_by)
    if settled_by:
        assert f"final before the other rows: {'; '.join(settled_by)} " in h7(payload)
    report = loop_study_markdown(settings, payload)
    h6 = report.split("**H6 learned maps**")[1].split("\n- **")[0]
    if "does not hold**" not in h6:  # holding (or open), H6 rests on every row: interim while any is short
        assert "**Interim verdict:" in h6

    if below:
        short = json.loads(json.dumps(payload))
        short["runs"] = payload["runs"]
        for label in below:
            short["rows"][label]["versus"]["untied U"]["seeds"] = len(REGISTRATION["seeds"]) - 1
        assert f"**Interim verdict: {expected}" in h7(short)

    # H4 rests on the parts' rows alone: with each of their contrasts on every seed it is final, the onset's rows unrun.
    parts_done = json.loads(json.dumps(payload))
    parts_done["runs"] = payload["runs"]
    parts = [label for label in parts_done["rows"] if HYPOTHESIS_CONTRASTS["H4"](label)]
    for label in parts:
        for name in HYPOTHESIS_CONTRASTS["H4"](label):
            parts_done["rows"][label]["versus"][name]["seeds"] = len(REGISTRATION["seeds"])
    h4 = loop_study_markdown(settings, parts_done).split("**H4 parts**")[1].split("\n- **")[0]
    assert "**Verdict:" in h4 and "every row that bears on it has each of its contrasts paired on every registered seed" in h4
    parts_done["rows"][parts[0]]["versus"]["whole recipe"]["seeds"] -= 1
    assert "**Interim verdict:" in loop_study_markdown(settings, parts_done).split("**H4 parts**")[1].split("\n- **")[0]

    some_run = payload["runs"]["untied, 4 blocks"][100]
    full = {label: {seed: some_run | {"label": label, "seed": seed} for seed in REGISTRATION["seeds"]} for label in payload["runs"]}
    report = loop_study_markdown(settings, payload | {"runs": full})
    assert "**Interim verdict" not in report and "**Verdict:" in report and "final before the other rows" not in report


def test_a_loop_report_shows_the_trainable_parameters_each_row_ended_with():
    """"Equal parameters" is the study's condition, and the recipe's adapters break it by a little: the committed
    language report's table gives each row the count its records ended with, so a reader sees by how much."""
    payload = json.loads((REPO_ROOT / "bench" / "reports" / "study" / "loops-language" / "results.json").read_text())
    table = (REPO_ROOT / "bench" / "reports" / "study" / "loops-language" / "results.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| row |"))
    column = header.strip("|").split("|").index(" trainable parameters ")
    for label, by_seed in payload["runs"].items():
        counts = {run["trainable_parameters"] for run in by_seed.values()}
        if not counts or label.startswith("dlt"):  # a learned map ends each seed with its own count
            continue
        assert len(counts) == 1, f"{label}: a fixed map ends every seed with one count"
        row = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
        assert row.strip("|").split("|")[column].strip() == f"{counts.pop():,}"
    untied = payload["runs"]["untied, 4 blocks"]["100"]["trainable_parameters"]
    assert payload["runs"]["cycle:4, 12 positions"]["100"]["trainable_parameters"] == untied
    assert payload["runs"]["cycle:4, 12 positions + recipe"]["100"]["trainable_parameters"] > untied


def _rival_folder(results: Path, records: dict[int, dict]) -> None:
    """A results folder of preset loops-language-steps holding `records` as its `untied, 4 blocks` runs."""
    _results_folder(results / "loops-language-steps", "loops-language-steps", "untied, 4 blocks", records)


def _results_folder(folder: Path, preset: str, label: str, records: dict[int, dict]) -> None:
    """A results folder of preset `preset` holding `records` as its runs of row `label`."""
    settings = resolve_settings(BenchArguments(preset=preset))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps({"fingerprint": settings.fingerprint(), "baselines": {}}))
    for seed, record in records.items():
        spec = next(spec for spec in independent_runs(settings, seed) if spec.label == label)
        (folder / spec.directory).mkdir(parents=True, exist_ok=True)  # a record written again replaces the first
        (folder / spec.directory / "result.json").write_text(json.dumps(record))


def test_a_rerun_check_pairs_rows_trained_again_with_the_study_s_records(tmp_path):
    """bench/rerun_check.py: a seed trained again on the study's hardware is counted as repeated only when its loss
    is the study's to the last digit; the seeds trained on other hardware, and only those, give the paired difference
    (rerun minus study), row by row; a loop study is compared on its pre-registered metric; a row the preset has not,
    the study's own folder as the rerun, or a rerun sharing no seed with the study is refused, naming the flag."""
    from bench.rerun_check import RerunCheckArguments, folder_rows, row_records, study_metric, write_report

    label, other_label, seeds = "0 1 2 1 2 5 + recipe", "untied, 4 blocks", REGISTRATION["seeds"]
    studied = folder_rows("loops-language", REPO_ROOT / "bench" / "results" / "loops-language", "--preset")
    study = row_records(studied, label, "loops-language")
    moved = {seed: study[seed] | {"hardware": "Another CPU, 1 thread(s) per run", "test_loss": study[seed]["test_loss"] + 0.01 + seed / 1e4} for seed in seeds[:6]}
    drifted = {seeds[8]: study[seeds[8]] | {"test_loss": study[seeds[8]]["test_loss"] + 1e-6, "commit": None}}  # run outside git
    _results_folder(tmp_path / "rerun", "loops-language", label, moved | {seed: study[seed] for seed in seeds[6:8]} | drifted)
    repeated = {seed: row_records(studied, other_label, "loops-language")[seed] for seed in seeds[:3]}
    _results_folder(tmp_path / "rerun", "loops-language", other_label, repeated)

    arguments = RerunCheckArguments(preset="loops-language", rows=f"{label} | {other_label}", rerun=str(tmp_path / "rerun"), report_dir=str(tmp_path / "report"))
    report = write_report(arguments).read_text()
    payload = json.loads((tmp_path / "report" / "rerun.json").read_text())
    other = payload["rows"][label]["other_hardware"]
    assert other["seeds"] == 6 and other["verdict"] == "higher" and abs(other["mean"] - 0.01 - sum(seeds[:6]) / 6e4) < 1e-9
    assert payload["metric"] == "test_loss" and payload["rows"][other_label]["other_hardware"] is None
    assert f"- `{label}`: same hardware, 2 of 3 seed(s) repeated the study's value to the last digit; other hardware" in report
    assert f"- `{other_label}`: same hardware, 3 of 3 seed(s) repeated the study's value to the last digit." in report
    assert report.count("repeated to the last digit |") == 5 and "| Another CPU, 1 thread(s) per run |" in report
    assert "| +1e-06 |" in report  # a seed that missed by a little does not read as a repeat
    assert "| unrecorded |" in report  # the commit of a run made outside git
    assert study_metric("loops-hop") == "mean_accuracy" and study_metric("default") == "test_loss"
    with pytest.raises(ValueError, match="--rows 'no such row': preset 'loops-language''s study has no such row"):
        write_report(dataclasses.replace(arguments, rows=f"{label}|no such row"))
    with pytest.raises(ValueError, match="--rerun .*: the study's own folder"):
        write_report(dataclasses.replace(arguments, rerun=str(REPO_ROOT / "bench" / "results" / "loops-language")))
    _results_folder(tmp_path / "elsewhere", "loops-language", other_label, repeated)
    with pytest.raises(ValueError, match="--rerun .*: no finished seed of '0 1 2 1 2 5 \\+ recipe' that the study has too"):
        write_report(dataclasses.replace(arguments, rerun=str(tmp_path / "elsewhere")))
    with pytest.raises(FileNotFoundError, match="--rerun: .* has no settings.json"):
        write_report(dataclasses.replace(arguments, rerun=str(tmp_path / "nowhere")))


def test_a_frozen_recipe_preset_s_records_are_read_under_the_recipe_its_folder_was_claimed_under():
    """`preset_study`, which rerun_check.py and loop_compute.py read records through, reads a `frozen_recipe`
    preset's own folder (the k-hop studies, depth-fresh here) rather than refusing it as measured under other
    settings."""
    from bench.report import preset_study

    table = preset_study("depth-fresh", REPO_ROOT / "bench" / "results" / "depth-fresh")
    assert table["0 1 1 1"] and all(len(by_seed) == 10 for by_seed in table.values())


def test_the_equal_compute_addendum_pairs_its_rows_by_seed_and_shows_whether_its_registration_came_first(tmp_path):
    """bench/loop_compute.py: the loop's records from loops-language, the rival's from loops-language-steps, paired on
    the seeds both have; interim while a registered seed is missing, final and holding when the loop is below on
    every seed; a rival record naming no commit of the addendum is flagged; a rival folder measured under other
    settings is refused, naming it."""
    from bench import loop_compute

    results = tmp_path / "results"
    results.mkdir()
    (results / "loops-language").symlink_to(REPO_ROOT / "bench" / "results" / "loops-language")
    loop = loop_compute.row_records({"preset": "loops-language", "label": "0 1 2 1 2 5 + recipe"}, results)
    assert sorted(loop) == REGISTRATION["seeds"]
    registered = "1f389eca8dd918f0fc97ee5e1f1ac24db16bcb8c"  # what measure.py records from loop_study.addendum_commit
    rival = {seed: run | {"label": "untied, 4 blocks", "test_loss": run["test_loss"] + 0.05 + seed / 1e4, "preregistration_commit": registered} for seed, run in loop.items()}
    _rival_folder(results, {seed: rival[seed] for seed in REGISTRATION["seeds"][:5]})

    report = loop_compute.write_report(tmp_path / "report", results).read_text()
    assert "**Interim verdict: holds** (until both rows have the 10 registered seeds)" in report
    assert f"every record of the rival started under it committed as it is, in commit {registered}" in report
    payload = json.loads((tmp_path / "report" / "compute-language.json").read_text())
    assert payload["rows"]["loop"]["versus_rival"]["seeds"] == 5 and payload["rows"]["loop"]["versus_rival"]["verdict"] == "lower"

    early = REGISTRATION["seeds"][5]
    rival[early + 1]["preregistration_commit"] = "a later commit"  # the addendum edited and committed again
    _rival_folder(results, {seed: rival[seed] for seed in REGISTRATION["seeds"][5:]})
    report = loop_compute.write_report(tmp_path / "report", results).read_text()
    assert f"in commit {registered}, a later commit (more than one: the addendum was changed between the rival's runs)" in report
    del rival[early]["preregistration_commit"]  # a run started under no committed addendum
    _rival_folder(results, {seed: rival[seed] for seed in REGISTRATION["seeds"][5:]})
    report = loop_compute.write_report(tmp_path / "report", results).read_text()
    assert "**Verdict: holds**" in report and "NOT every record of the rival names a commit that held it" in report

    settings_file = results / "loops-language-steps" / "settings.json"
    settings_file.write_text(json.dumps({"fingerprint": json.dumps({"max_steps": 2000}), "baselines": {}}))
    with pytest.raises(ValueError, match="loops-language-steps holds runs measured under other settings than preset 'loops-language-steps'"):
        loop_compute.write_report(tmp_path / "report", results)


def test_a_folder_trained_off_the_registered_settings_names_each_departure():
    """The GPU preset's page says it is not the registered study, and by which settings; the registered presets'
    pages say nothing of the kind (seeds, a scheduling setting, are no departure)."""
    gpu = preregistered(PRESETS["loops-language-gpu"])
    assert departures(gpu, "loops-language") == {"n_embd": (384, 64), "n_head": (6, 4), "use_gpu": (True, False)}
    for preset in REGISTERED_PRESETS:
        assert departures(preregistered(PRESETS[preset]), preset) == {}
