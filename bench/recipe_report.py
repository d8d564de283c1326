"""Issue 53, part 2: the recipe grid. The same rows (preset `recipe`) trained under each recipe, side by side; the
recipe chosen on seeds 0-4 by validation only; and how the gradients behaved, the measurements behind the choice.

Each recipe is a results folder of its own, `bench/results/recipe/<lr_scheduler_type>-wd<weight_decay>`, filled by

    python bench/run_bench.py --preset recipe --seeds 0,1,2,3,4 --lr_scheduler_type linear --weight_decay 0.01 \
        --results_dir bench/results/recipe/linear-wd0.01 --report_dir bench/reports/study/recipe/linear-wd0.01

and this script reads every such folder (a partly filled one too) and writes `bench/reports/study/recipe/`:

    python bench/recipe_report.py

The choice: one recipe for tied and untied rows alike, the one with the lowest mean validation loss over every
(row, seed) pair of the looped model and 2 untied blocks (`CHOICE_ROWS`) on seeds 0-4 that all recipes have; each
row's own best is reported beside it (the issue allows either). Seeds 5-14 are not read here: they are the fresh
seeds the chosen recipe is then frozen for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from bench.markdown_tables import refresh_after_report  # noqa: E402
from bench.provenance import source_lines  # noqa: E402
from bench.report import interval, load_result  # noqa: E402
from bench.settings import (  # noqa: E402
    PRESETS,
    RECIPE_FIELDS,
    RECIPE_FIRST,
    RECIPE_REPORT,
    folder_recipe,
    folder_settings,
    recipe_runs,
    untied_label,
)
from bench.templates import render  # noqa: E402

CHOICE_SEEDS = (0, 1, 2, 3, 4)  # the issue: a recipe is chosen on seeds 0-4, then frozen for fresh seeds 5-14
# The rows a recipe is chosen on: the looped model whose lost seeds raised the question, and its rival at equal
# memory, so that one recipe serves tied and untied rows alike (and the rows gradients.png draws). The other recipe
# rows are reported beside them, not required: each would cost 20 runs more (4 recipes x 5 seeds).
CHOICE_ROWS = (RECIPE_FIRST, untied_label(PRESETS["recipe"]))
PHASES = 4  # a run's gradient log is summarised by quarters of its steps: plateau, drop and the end differ
MAX_GRAD_NORM = TrainingArguments.max_grad_norm  # the study clips at transformers' default


def recipe_of(folder: Path) -> dict:
    """A results folder's recipe, named, from the settings it was measured under."""
    recipe = folder_recipe(folder)
    return {"name": f"{recipe['lr_scheduler_type']}, weight decay {recipe['weight_decay']:g}", **recipe}


def check_recipes_alone_differ(folders: list[Path]) -> None:
    """Refuse folders that differ in more than the recipe (steps, rates, task: their rows would be compared as
    recipes), and two folders of one recipe (one would hide the other)."""
    by_settings: dict[str, list[Path]] = {}
    by_recipe: dict[str, list[Path]] = {}
    for folder in folders:
        settings = {name: value for name, value in folder_settings(folder).items() if name not in RECIPE_FIELDS}
        by_settings.setdefault(json.dumps(settings, sort_keys=True), []).append(folder)
        by_recipe.setdefault(recipe_of(folder)["name"], []).append(folder)
    if len(by_settings) > 1:
        groups = "; ".join(", ".join(str(folder) for folder in group) for group in by_settings.values())
        raise SystemExit(f"recipe folders measured under different settings besides the recipe ({groups}): compare one set")
    for name, group in by_recipe.items():
        if len(group) > 1:
            raise SystemExit(f"recipe {name!r} in {len(group)} folders ({', '.join(map(str, group))}): keep one")


def collect(folder: Path) -> dict[str, dict[int, dict]]:
    """The finished runs of a recipe folder: label -> seed -> record."""
    runs: dict[str, dict[int, dict]] = {}
    read_from: dict[tuple[str, int], Path] = {}
    for result in sorted((folder / "study").rglob("result.json")):
        record = load_result(result.parent)
        key = (record["label"], record["seed"])
        if key in read_from:  # e.g. one row trained at two learning rates: which one the grid means is not known
            raise SystemExit(f"{folder}: two records of {key[0]!r} seed {key[1]}, {read_from[key]} and {result}; keep one")
        read_from[key] = result
        runs.setdefault(record["label"], {})[record["seed"]] = record
    return runs


def _mean_with_interval(runs: dict[int, dict], key: str) -> list[float] | None:
    values = [run[key] for run in runs.values() if key in run]
    return list(interval(values)) if values else None


def grid_cell(runs: dict[int, dict]) -> dict:
    """A row under one recipe: mean and interval over its seeds of what a recipe is chosen on (validation) and what
    it is judged by (test), and each seed's validation loss and accuracy (None for a seed of 0-4 not run yet)."""
    cell = {"seeds": sorted(runs)}
    for key in ("validation_loss", "validation_mean_accuracy", "test_loss", "mean_accuracy"):
        cell[key] = _mean_with_interval(runs, key)
    seeds = sorted(set(CHOICE_SEEDS) | set(runs))  # every choice seed, None where it has not run
    for key in ("validation_loss", "mean_accuracy"):
        cell[f"{key}_by_seed"] = {seed: runs[seed].get(key) if seed in runs else None for seed in seeds}
    return cell


def choose(
    recipes: dict[str, dict[str, dict[int, dict]]], rows: tuple[str, ...] = CHOICE_ROWS, seeds: tuple[int, ...] = CHOICE_SEEDS
) -> dict:
    """The recipe with the lowest mean validation loss over the (row, seed) pairs of `rows` and `seeds` that every
    recipe has; and each row's own lowest. `complete` says whether those pairs are every row in every seed."""
    names = list(recipes)
    pairs = [(label, seed) for label in rows for seed in seeds if all(seed in recipes[name].get(label, {}) for name in names)]
    complete = len(pairs) == len(rows) * len(seeds)
    if not pairs:
        return {"recipe": None, "pairs": 0, "complete": False, "mean_validation_loss": {}, "per_row": {}}
    means = {name: statistics.fmean(recipes[name][label][seed]["validation_loss"] for label, seed in pairs) for name in names}
    per_row = {}
    for label in rows:
        row_seeds = [seed for row_label, seed in pairs if row_label == label]
        if row_seeds:
            row_means = {name: statistics.fmean(recipes[name][label][seed]["validation_loss"] for seed in row_seeds) for name in names}
            per_row[label] = {"recipe": min(row_means, key=row_means.get), "seeds": row_seeds, "mean_validation_loss": row_means}
    return {"recipe": min(means, key=means.get), "pairs": len(pairs), "complete": complete, "mean_validation_loss": means, "per_row": per_row}


def gradient_phases(runs: dict[int, dict]) -> dict[str, dict]:
    """A row's gradient log by quarters of training, pooled over seeds: mean training loss, median gradient norm
    before clipping, the share of logged steps that clipping cut, and the median share of the clipped gradient's
    squared norm that the blocks hold (the rest: embeddings, final norm, head). A shared block's gradient is the sum
    of its positions'; if that sum were what clipping cuts, the blocks' share would be high where clipping is.
    Keyed by quarter, "1" to "4"."""
    logged = [run for run in runs.values() if run.get("training_log") and run.get("gradient_norms")]
    if not logged:
        return {}
    steps = max(run["trained_steps"] for run in logged)
    phases = {}
    for quarter in range(PHASES):
        low, high = quarter * steps / PHASES, (quarter + 1) * steps / PHASES
        log = [row for run in logged for row in run["training_log"] if low < row["step"] <= high and "grad_norm" in row]
        norms = [row for run in logged for row in run["gradient_norms"] if low < row["step"] <= high]
        if not log or not norms:
            continue
        phases[str(quarter + 1)] = {
            "steps": [int(low), int(high)],
            "loss": statistics.fmean(row["loss"] for row in log),
            "grad_norm_median": statistics.median(row["grad_norm"] for row in log),
            "clipped_share": sum(row["grad_norm"] > MAX_GRAD_NORM for row in log) / len(log),
            "block_share_median": statistics.median(_block_share(row) for row in norms),
        }
    return phases


def _block_share(row: dict) -> float:
    blocks = sum(block["norm"] ** 2 for block in row["blocks"].values())
    total = blocks + row["other"] ** 2
    return blocks / total if total > 0 else float("nan")


def write_recipe_report(results: Path, report_dir: Path) -> Path:
    """results.json, results.md and gradients.png of every recipe folder under `results`."""
    folders = sorted(folder for folder in results.iterdir() if (folder / "settings.json").is_file())
    if not folders:
        raise SystemExit(f"{results}: no recipe folders (each a results folder of `run_bench.py --preset recipe`)")
    check_recipes_alone_differ(folders)
    described = {folder: recipe_of(folder) for folder in folders}
    recipes = {recipe["name"]: collect(folder) for folder, recipe in described.items()}
    payload = {
        "recipes": {recipe["name"]: recipe | {"folder": folder.relative_to(REPO_ROOT).as_posix()} for folder, recipe in described.items()},
        "choice_rows": list(CHOICE_ROWS),
        "choice_seeds": list(CHOICE_SEEDS),
        "max_grad_norm": MAX_GRAD_NORM,
        "choice": choose(recipes),
        # Which code each run came from, rows named with their recipe (`source_lines` groups runs by label).
        "provenance": source_lines(
            [record | {"label": f"{label} | {name}"} for name, runs in recipes.items() for label, by_seed in runs.items() for record in by_seed.values()]
        ),
        "rows": {
            f"{label} | {name}": grid_cell(runs[label]) | {"label": label, "recipe": name, "gradient_phases": gradient_phases(runs[label])}
            for label in _labels(recipes)
            for name, runs in recipes.items()
            if label in runs
        },
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "results.json").write_text(json.dumps(payload, indent=2))
    _plot_gradients(recipes, report_dir / "gradients.png")
    report = report_dir / "results.md"
    report.write_text(_markdown(payload))
    return report


def _labels(recipes: dict[str, dict[str, dict[int, dict]]]) -> list[str]:
    """Every row label that has a run, in the order the recipe preset runs them."""
    measured = set().union(*(runs.keys() for runs in recipes.values()))
    return [spec.label for spec in recipe_runs(PRESETS["recipe"], CHOICE_SEEDS[0]) if spec.label in measured]


def _markdown(payload: dict) -> str:
    """The recipe grid's page (bench/templates/recipe.md.jinja) from its results.json."""
    sources = "\n".join(payload["provenance"][1:])  # less the blank line that opens them: the page has it
    return render("recipe.md.jinja", payload=payload, sources=sources)


def _plot_gradients(recipes: dict[str, dict[str, dict[int, dict]]], path: Path) -> None:
    """Per seed with a logged looped run: training loss and gradient norm before clipping over steps, the looped
    model (solid) and its equal-memory rival (dashed) under each recipe (a colour each)."""
    seeds = sorted({seed for runs in recipes.values() for seed, run in runs.get(CHOICE_ROWS[0], {}).items() if run.get("training_log")})
    if not seeds:
        return
    figure, axes = plt.subplots(2, len(seeds), figsize=(4.5 * len(seeds), 6.5), squeeze=False, sharex=True)
    colours = dict(zip(recipes, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for column, seed in enumerate(seeds):
        for name, runs in recipes.items():
            for label, style in zip(CHOICE_ROWS, ("-", "--")):
                log = runs.get(label, {}).get(seed, {}).get("training_log")
                if not log:
                    continue
                steps = [row["step"] for row in log]
                axes[0][column].plot(steps, [row["loss"] for row in log], style, color=colours[name], label=f"{label}, {name}", linewidth=1)
                axes[1][column].plot(steps, [row["grad_norm"] for row in log], style, color=colours[name], linewidth=1)
        axes[0][column].set_title(f"seed {seed}")
        axes[1][column].axhline(MAX_GRAD_NORM, color="grey", linewidth=0.8)
        axes[1][column].set_yscale("log")
        axes[1][column].set_xlabel("optimizer step")
    axes[0][0].set_ylabel("training loss")
    axes[1][0].set_ylabel("gradient norm before clipping")
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results_dir", type=Path, default=REPO_ROOT / "bench" / "results" / "recipe", help="the folder of recipe folders")
    parser.add_argument("--report_dir", type=Path, default=RECIPE_REPORT.parent)
    args = parser.parse_args()
    print(f"Report: {write_recipe_report(args.results_dir, args.report_dir)}")
    refresh_after_report(args.report_dir)


if __name__ == "__main__":
    main()
