"""bench/recipe_report.py: the recipe chosen on seeds 0-4 by validation only, over pairs every recipe has, and the
committed report equal to what its records regenerate."""

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # `bench` is a folder of the repository, not part of the installed package

from bench.recipe_report import choose, write_recipe_report  # noqa: E402


def _runs(losses: dict[str, dict[int, float]]) -> dict[str, dict[int, dict]]:
    return {label: {seed: {"validation_loss": loss, "test_loss": 0.0} for seed, loss in seeds.items()} for label, seeds in losses.items()}


def test_the_choice_reads_only_seeds_0_to_4_and_pairs_every_recipe_has():
    recipes = {
        "a": _runs({"looped": {seed: 1.0 for seed in range(5)}, "untied": {seed: 0.5 for seed in range(5)}}),
        # lower on its one unpaired run (looped, seed 4) and on a fresh seed, higher on the pairs
        "b": _runs({"looped": {0: 1.1, 1: 1.1, 2: 1.1, 3: 1.1, 9: 0.0}, "untied": {seed: 0.4 for seed in range(5)}}),
    }
    choice = choose(recipes, rows=("looped", "untied"))
    assert choice["pairs"] == 9 and not choice["complete"]
    assert choice["mean_validation_loss"]["a"] == (4 * 1.0 + 5 * 0.5) / 9
    assert choice["mean_validation_loss"]["b"] == (4 * 1.1 + 5 * 0.4) / 9
    assert choice["recipe"] == "b"  # 0.711 < 0.722
    assert choice["per_row"]["looped"]["recipe"] == "a" and choice["per_row"]["looped"]["seeds"] == [0, 1, 2, 3]
    assert choice["per_row"]["untied"]["recipe"] == "b"


def test_a_complete_grid_says_so_and_a_recipe_without_runs_leaves_no_choice():
    full = _runs({"looped": {seed: 1.0 for seed in range(5)}})
    assert choose({"a": full, "b": _runs({"looped": {seed: 2.0 for seed in range(5)}})}, rows=("looped",))["complete"]
    assert not choose({"a": full, "b": full}, rows=("looped", "untied"))["complete"]  # a row no recipe has run
    assert choose({"a": full, "b": {}}, rows=("looped",))["recipe"] is None


def test_the_committed_recipe_report_is_what_its_records_give(tmp_path):
    committed = REPO_ROOT / "bench" / "reports" / "study" / "recipe" / "results.json"
    write_recipe_report(REPO_ROOT / "bench" / "results" / "recipe", tmp_path)
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(committed.read_text())
    assert (tmp_path / "results.md").read_text() == committed.with_name("results.md").read_text()


def test_two_records_of_one_row_and_seed_in_a_folder_are_refused_naming_both(tmp_path):
    import pytest

    from bench.recipe_report import collect

    for run in ("L2/none/seed0", "L2/none-lr0.01/seed0"):  # the same row at two learning rates
        (tmp_path / "study" / run).mkdir(parents=True)
        (tmp_path / "study" / run / "result.json").write_text(json.dumps({"label": "untied, 2 blocks", "seed": 0}))
    with pytest.raises(SystemExit, match=r"two records of 'untied, 2 blocks' seed 0, .*none/seed0/result.json and .*none-lr0.01/seed0/result.json; keep one"):
        collect(tmp_path)


def test_recipe_folders_that_differ_beside_the_recipe_or_repeat_one_are_refused(tmp_path):
    import dataclasses

    import pytest

    from bench.recipe_report import check_recipes_alone_differ
    from bench.settings import PRESETS

    def claimed(name: str, **recipe) -> Path:
        fingerprint = dataclasses.replace(PRESETS["recipe"], **recipe).fingerprint()
        (tmp_path / name).mkdir()
        (tmp_path / name / "settings.json").write_text(json.dumps({"fingerprint": fingerprint}))
        return tmp_path / name

    folders = [claimed("cosine-wd0.1"), claimed("linear-wd0.01", lr_scheduler_type="linear", weight_decay=0.01)]
    check_recipes_alone_differ(folders)

    longer = tmp_path / "linear-wd0.01" / "settings.json"
    settings = json.loads(longer.read_text())
    fields = json.loads(settings["fingerprint"])
    longer.write_text(json.dumps(settings | {"fingerprint": json.dumps(fields | {"max_steps": fields["max_steps"] * 2})}))
    with pytest.raises(SystemExit, match=r"recipe folders measured under different settings besides the recipe"):
        check_recipes_alone_differ(folders)

    with pytest.raises(SystemExit, match=r"recipe 'cosine, weight decay 0.1' in 2 folders"):
        check_recipes_alone_differ([folders[0], claimed("again")])
