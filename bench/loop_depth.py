#!/usr/bin/env python
"""Inference depth of the loop study's winners (issue 76, item 4; bench/preregistration/looped-models.json, "analyses
after the runs"): a task's looped row of highest validation score, scored at fewer and more loops than it trained
with, the cost per token beside each score. Not a hypothesis: no verdict.

    python bench/loop_depth.py --task language   # bench/results/loops-depth-language, report in bench/reports/study/loops
    python bench/loop_depth.py --task hop
    python bench/loop_depth.py --task language --report_only true   # the report again, from the records

1. The row, by the rule `RULE` (the pre-registration's words, made exact): among the task's looped rows (each
   registered layout alone or under a setting of the recipe or the onset; not the untied baselines, and not DLT,
   whose map is learned per run, so it has no registered loop to count), the one of best mean validation score over
   the seeds its committed records have finished (the study's folder, bench/results/loops-<task>): the lowest mean
   `validation_loss` for language, the highest mean `validation_mean_accuracy` for k-hop (the pre-registered metrics
   are the test ones, `test_loss` and `mean_accuracy`: the test split plays no part in the choice). A tie goes to the
   row trained first. The choice, and every candidate's mean and seeds, are printed and kept in the folder's
   settings.json when the folder is first claimed; a later call whose records choose another row is refused (another
   `--results_dir`, or the folder deleted, starts over). With no record, the command stops, naming the folder.
2. That row trained again at the lowest registered seed through the study's own path (`bench/measure.py`'s `run`, at
   the settings the study's folder was claimed under), its weights kept (`<run>/model`, not committed).
3. The saved model scored on the test split, with the study's metric, at every loop count from one to the trained
   one (`skipped_positions`, per call: the last loops skipped) and at `--extra_loops` more (the checkpoint loaded
   into the same tied class with a longer map that repeats the looped segment more times, `at_loops`). What one
   loop is, per layout (`LoopSegment`): the map's looped segment is the run of positions whose blocks repeat, the
   first use of each included (`cycle:U` over nU positions: the whole stack, one loop U positions; `0 1 1 3 4`:
   position 1's block, one loop one position, 2 loops trained; `0 1 2 1 2 5`: positions 1-2, one loop 2 positions).
   The positions before and after the segment compute at every loop count. Where the loop recipe changes more than
   the loop count at a depth other than the trained one, each record says so (`recipe_notes`): residual scaling
   divides a block's update by the positions computing it at the depth computed (1/k at k loops, not the trained
   1/n); per-position adapters of skipped positions go unused, and added positions have none (the shared weights
   alone).
4. The cost beside each score: block calls per token (the positions computed) and the wall time per token of a
   forward pass over the same test batches, every depth timed in one process in rounds, each round one depth later
   (bench/step_time.py's design), the median over rounds.

Resumable: every piece (the run, each depth's score, the timing) writes its `result.json` whole when it finishes and
is read back, not redone; the report (`inference-depth-<task>.md` and `.json`) is written from those records alone.
`--smoke true` runs the whole command at tiny sizes into a folder of its own (`--results_dir`), to check it works.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import HfArgumentParser

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from bench.loop_study import LoopRow, read_preregistration, task_rows  # noqa: E402
from bench.markdown_tables import refresh_after_report  # noqa: E402
from bench.provenance import provenance, source_lines  # noqa: E402
from bench.scheduling import RESULT_FILE, write_complete, write_whole  # noqa: E402
from bench.settings import BenchArguments, BenchSettings, RunSpec, freeze_recipe, measured_under, resolve_settings  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results"
REPORT = REPO_ROOT / "bench" / "reports" / "study" / "loops"
RULE = (
    "among the task's looped rows (each registered layout alone or under a setting of the recipe or the onset; not "
    "the untied baselines, nor DLT, whose map is learned per run), the one of best mean validation score over the "
    "seeds its committed records have finished: lowest mean validation loss for language, highest mean validation "
    "accuracy (mean over hop counts) for k-hop; a tie goes to the row trained first"
)
# The sizes of `--smoke true`: preset tiny's model, steps and evaluation caps, and a small k-hop task.
SMOKE = dict(n_embd=32, n_head=2, max_steps=12, batch_size=4, warmup_steps=0, max_test_blocks=16, max_validation_blocks=16)
SMOKE_HOP_TASK = ("hop_induction:length=16,max_hops=2,train_examples=200,eval_examples=40", 18)


def task_names() -> dict[str, str]:
    """`--task` -> the pre-registration's task: each task by its preset's name less `loops-` (`hop`, `language`)."""
    return {plan["preset"].removeprefix("loops-"): task for task, plan in read_preregistration()["tasks"].items()}


@dataclass
class LoopDepthArguments:
    """Flags of `bench/loop_depth.py`."""

    task: str = field(metadata={"help": "The study's task, by its preset's name less `loops-`: language or hop."})
    study_results: str | None = field(
        default=None, metadata={"help": "The study's records the row is chosen from. Default: bench/results/loops-<task>."}
    )
    results_dir: str | None = field(
        default=None, metadata={"help": "Where this analysis' records go. Default: bench/results/loops-depth-<task>."}
    )
    report_dir: str | None = field(
        default=None,
        metadata={"help": "Where the report goes. Default: bench/reports/study/loops for the default results folder, else that folder."},
    )
    extra_loops: int = field(default=2, metadata={"help": "Loop counts scored above the trained one: 1 or 2."})
    rounds: int = field(default=5, metadata={"help": "Timing rounds, each a forward pass of every depth over the timed batches."})
    timing_batches: int | None = field(default=None, metadata={"help": "Test batches timed per depth and round. Default: all."})
    report_only: bool = field(default=False, metadata={"help": "Write the report from the folder's records; compute nothing."})
    smoke: bool = field(
        default=False,
        metadata={"help": "A check that the command works: the chosen row trained at tiny sizes (preset tiny's), into --results_dir (required)."},
    )

    def __post_init__(self):
        names = task_names()
        if self.task not in names:
            raise ValueError(f"--task {self.task!r}: expected one of {', '.join(sorted(names))}")
        if self.extra_loops not in (1, 2):
            raise ValueError(f"--extra_loops must be 1 or 2, got {self.extra_loops}")
        if self.rounds < 1 or (self.timing_batches is not None and self.timing_batches < 1):
            raise ValueError("--rounds and --timing_batches must be >= 1")
        if self.smoke and self.results_dir is None:
            raise ValueError("--smoke true trains at tiny sizes: pass a --results_dir of its own, never the analysis' folder")

    @property
    def registered_task(self) -> str:
        return task_names()[self.task]

    def study_folder(self) -> Path:
        return Path(self.study_results) if self.study_results else RESULTS / f"loops-{self.task}"

    def output(self) -> Path:
        return Path(self.results_dir) if self.results_dir else RESULTS / f"loops-depth-{self.task}"

    def report_folder(self) -> Path:
        if self.report_dir is not None:
            return Path(self.report_dir)
        return REPORT if self.results_dir is None else self.output()


# ----- 1. the row -----


def validation_key(task: str) -> str:
    """The record field the choice reads: the validation counterpart of the task's pre-registered metric."""
    metric = read_preregistration()["tasks"][task]["metric"]
    return {"test_loss": "validation_loss", "mean_accuracy": "validation_mean_accuracy"}[metric]


def looped_rows(task: str) -> list[LoopRow]:
    """The task's rows on a registered looped layout (`static:` maps), in the order they train."""
    return [row for row in task_rows(read_preregistration(), task) if row.strategy.startswith("static:")]


def study_records(folder: Path, task: str) -> dict[str, dict[int, dict]]:
    """The study's finished records of the task's looped rows at registered seeds: label -> seed -> record."""
    seeds = set(read_preregistration()["seeds"])
    rows = {row.label: row for row in looped_rows(task)}
    found: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob(f"study/**/{RESULT_FILE}")):
        record = json.loads(path.read_text())
        row = rows.get(record.get("label"))
        if row is None or record["seed"] not in seeds:
            continue
        if record["strategy"] != row.strategy:
            raise ValueError(f"{path}: row {row.label!r} trains {row.strategy}, the record says {record['strategy']}")
        found.setdefault(row.label, {})[record["seed"]] = record | {"path": str(path)}
    return found


def choose_row(records: dict[str, dict[int, dict]], task: str, folder: Path) -> dict:
    """`RULE` applied to `records` (`study_records`): the chosen label, and every candidate's mean and seeds. A row
    whose mean is not finite (a diverged seed) is never chosen; no record at all stops the command."""
    key, order = validation_key(task), [row.label for row in looped_rows(task)]
    lowest = key == "validation_loss"
    candidates = []
    for label in order:
        by_seed = records.get(label, {})
        if not by_seed:
            continue
        missing = [record["path"] for record in by_seed.values() if key not in record]
        if missing:
            raise ValueError(f"{missing[0]}: no {key!r}, which the choice for task {task!r} reads")
        mean = statistics.fmean(record[key] for record in by_seed.values())
        candidates.append({"label": label, "seeds": sorted(by_seed), "mean": mean})
    finite = [candidate for candidate in candidates if math.isfinite(candidate["mean"])]
    if not finite:
        raise SystemExit(
            f"{folder}: no finished record of a looped row of task {task!r} with a finite {key} (study/**/{RESULT_FILE}): "
            "train the study's rows first (bench/run_bench.py --preset loops-...)"
        )
    best = (min if lowest else max)(finite, key=lambda candidate: candidate["mean"])  # the first of equals: trained first
    return {"rule": RULE, "metric": key, "label": best["label"], "seeds": best["seeds"], "mean": best["mean"], "candidates": candidates}


# ----- 2. the run -----


def study_settings(arguments: LoopDepthArguments) -> BenchSettings:
    """The settings the study trained the task under (its preset as registered, under the recipe its folder froze),
    checked against the study folder's settings.json; `--smoke`: at preset tiny's sizes."""
    task = arguments.registered_task
    preset = read_preregistration()["tasks"][task]["preset"]
    bench_arguments = BenchArguments(preset=preset)
    folder = arguments.study_folder()
    settings = freeze_recipe(resolve_settings(bench_arguments), bench_arguments, folder)
    if arguments.smoke:  # not a registered run: its records name no registration (a copy without git runs it too)
        smoke = dict(SMOKE, loop_study=None, preregistration_digest=None)
        if settings.task is not None:
            smoke["task"], smoke["block_size"] = SMOKE_HOP_TASK
        return dataclasses.replace(settings, **smoke)
    claimed = folder / "settings.json"
    if not measured_under(folder, settings):
        raise SystemExit(
            f"{claimed}: the study's records were not measured under the settings preset {preset} resolves to now "
            "(or the folder has none): the row would train otherwise than the study trained it"
        )
    return settings


def chosen_spec(task: str, label: str) -> RunSpec:
    """The chosen row's run at the lowest registered seed, as the study's plan makes it (`loop_study_runs`)."""
    seed = min(read_preregistration()["seeds"])
    row = next(row for row in task_rows(read_preregistration(), task) if row.label == label)
    return RunSpec(row.label, row.strategy, seed, num_blocks=row.num_blocks, tying=row.tying, looped_config=row.looped_config)


def claim(output: Path, fields: dict) -> None:
    """Record what this folder's records are measured under (settings.json); refuse a folder claimed otherwise, e.g.
    a row the study's records chose before more of them finished."""
    output.mkdir(parents=True, exist_ok=True)
    path = output / "settings.json"
    if path.is_file():
        claimed = json.loads(path.read_text())
        differing = [name for name in ("fingerprint", "task", "smoke", "extra_loops", "spec") if claimed.get(name) != fields.get(name)]
        if differing:
            raise SystemExit(
                f"{output} holds records of another analysis ({', '.join(differing)} differ from {path}: chosen then "
                f"{claimed['choice']['label']!r} on seeds {claimed['choice']['seeds']}, now {fields['choice']['label']!r} "
                f"on seeds {fields['choice']['seeds']}); pass another --results_dir, or delete that folder to start over"
            )
        return
    write_whole(path, json.dumps(fields, indent=2))


# ----- 3. loops -----


@dataclass(frozen=True)
class LoopSegment:
    """A map's looped segment: positions `start` to `start + width * loops - 1` compute blocks `start` to
    `start + width - 1` in turn, `loops` times; the `positions - start - width * loops` positions after it and the
    `start` before it compute once. One loop is one pass over the segment's `width` blocks."""

    tying_map: tuple[int, ...]
    start: int
    width: int
    loops: int

    @classmethod
    def of(cls, tying_map) -> LoopSegment:
        """The segment of a canonical map with one (each position names the first with its weights); anything else
        (no repeat, repeats in two places, a segment whose blocks do not repeat in order) is refused."""
        tying_map = tuple(tying_map)
        repeated = [position for position, root in enumerate(tying_map) if root != position]
        roots = sorted({tying_map[position] for position in repeated})
        if not repeated or roots != list(range(roots[0], roots[-1] + 1)):
            raise ValueError(f"map {list(tying_map)}: no looped segment (a run of blocks repeated in order)")
        start, width, end = roots[0], len(roots), repeated[-1] + 1
        segment = cls(tying_map, start, width, (end - start) // width)
        if (end - start) % width or segment.map_at(segment.loops) != list(tying_map):
            raise ValueError(f"map {list(tying_map)}: not one looped segment (blocks {roots} repeated in order)")
        return segment

    @property
    def end(self) -> int:
        return self.start + self.width * self.loops

    def roles(self, loops: int) -> list[tuple[int, int | None]]:
        """For each position of the model at `loops` loops: (the trained position whose weights it computes with, the
        trained position it is, or None for a position added beyond the trained loops)."""
        segment = [(self.start + i % self.width, self.start + i if i < self.width * self.loops else None) for i in range(self.width * loops)]
        before = [(position, position) for position in range(self.start)]
        after = [(position, position) for position in range(self.end, len(self.tying_map))]
        return before + segment + after

    def map_at(self, loops: int) -> list[int]:
        """The canonical map of the model at `loops` loops."""
        weights = [root for root, _ in self.roles(loops)]
        return [weights.index(root) for root in weights]

    def skipped_at(self, loops: int) -> list[int]:
        """The trained model's positions skipped to compute `loops` (at most the trained ones): its last loops."""
        return list(range(self.start + self.width * loops, self.end))

    def words(self) -> str:
        """What one loop is, in words."""
        blocks = f"block {self.start}" if self.width == 1 else f"blocks {self.start}-{self.start + self.width - 1}"
        once = [*range(self.start), *range(self.end, len(self.tying_map))]
        where = "the whole stack" if not once else f"{blocks} over positions {self.start}-{self.end - 1} ({_listed(once)} computing once at every depth)"
        return f"map {' '.join(map(str, self.tying_map))}: the looped segment is {where}; one loop is one pass over {blocks} ({self.width} position{'s' if self.width > 1 else ''}), {self.loops} loops trained"


def _listed(positions: list[int]) -> str:
    """`position 0`, `positions 0, 3 and 4`."""
    if len(positions) == 1:
        return f"position {positions[0]}"
    return f"positions {', '.join(map(str, positions[:-1]))} and {positions[-1]}"


def at_loops(model, segment: LoopSegment, loops: int):
    """The trained `model` (a tied class) at `loops` loops, as a model of its own: the same class with the map
    `segment.map_at(loops)`, every position computing with the weights of the trained position it stands for (tied
    blocks stored once, as trained), its adapters those of that position; an added position carries adapters with a
    zero update (PEFT's initialisation: the shared weights alone). Built from the trained model's state dict rather
    than by `from_pretrained(folder, tying_map=..., num_hidden_layers=...)`, which reads a checkpoint's blocks by
    position: right where the added positions come after every trained one (`cycle:U`), wrong for a segment with
    positions after it (their blocks would be read into the positions the longer loop now holds)."""
    from hf_layertie.relaxed_ties import relax_ties

    roles = segment.roles(loops)
    config = model.config.to_dict()
    config[model.config.attribute_map.get("num_hidden_layers", "num_hidden_layers")] = len(roles)
    config |= {"tying_map": segment.map_at(loops), "skipped_positions": None}
    built = type(model)(type(model.config).from_dict(config))
    adapters = getattr(model, "peft_config", None)
    if adapters:
        (adapter,) = adapters.values()
        relax_ties(built, adapter.r, "zero")
    trained, prefix = model.state_dict(), f"{model.tied_blocks_path}."
    state = {}
    for key, value in built.state_dict().items():
        if not key.startswith(prefix):
            state[key] = trained[key]
            continue
        position, rest = key.removeprefix(prefix).split(".", 1)
        weights, stands_for = roles[int(position)]
        if stands_for is not None:
            state[key] = trained[f"{prefix}{stands_for}.{rest}"]
        else:  # an added position: the looped block's shared weights, and no adapter update
            state[key] = value if ".lora_" in key else trained[f"{prefix}{weights}.{rest}"]
    built.load_state_dict(state)
    return built.eval()


def recipe_notes(model, segment: LoopSegment, loops: int) -> list[str]:
    """What the loop recipe changes, beyond the loop count, when the model runs `loops` loops, not its trained count: each in words."""
    if loops == segment.loops:
        return []
    config, notes = model.config, []
    if getattr(config, "loop_residual_scale", False):
        notes.append(
            f"residual scaling: each looped block's update is divided by the positions computing it at this depth, "
            f"{loops}, where it trained divided by {segment.loops}"
        )
    if getattr(model, "peft_config", None):
        notes.append(
            "per-position adapters: the skipped positions' adapters go unused"
            if loops < segment.loops
            else "per-position adapters: the added positions have none trained, and compute with the shared weights alone"
        )
    if getattr(config, "loop_input_injection", False) and loops > segment.loops:
        notes.append("input injection: the added positions, repeated ones, get the token embeddings as the trained repeats do")
    return notes


# ----- 4. scores and cost -----


def eval_batches(settings: BenchSettings, splits) -> list[dict[str, torch.Tensor]]:
    """The test split in the batches the study evaluates it in: the Trainer's (4 x the training batch) for language,
    `evaluate_hop_task`'s 100 examples for a task."""
    test = splits["test"]
    size = 100 if settings.task is not None else 4 * settings.batch_size
    columns = ["input_ids", "attention_mask", "labels"]
    return [{name: torch.tensor(test[start : start + size][name]) for name in columns} for start in range(0, len(test), size)]


@torch.no_grad()
def score(model, settings: BenchSettings, splits, skipped: list[int]) -> dict:
    """The study's test metric of `model` computing all but `skipped`: the test loss (mean over tokens, as the
    Trainer's evaluation gives it for full blocks) for language; for a task the mean accuracy over hop counts
    (`evaluate_hop_task`, which calls the model without the argument: the config's `skipped_positions` for the call)."""
    from hf_layertie.language_modeling import evaluate_hop_task

    model.eval()
    if settings.task is not None:
        saved = model.config.skipped_positions
        model.config.skipped_positions = skipped or None
        try:
            scores = evaluate_hop_task(model, splits["test"], batch_size=100)
        finally:
            model.config.skipped_positions = saved
        return {"mean_accuracy": scores["mean_accuracy"], "accuracy_by_hops": scores["accuracy_by_hops"]}
    total, rows = 0.0, 0
    for batch in eval_batches(settings, splits):
        loss = model(**batch, skipped_positions=skipped, use_cache=False).loss
        total, rows = total + loss.item() * len(batch["input_ids"]), rows + len(batch["input_ids"])
    return {"test_loss": total / rows}


@torch.no_grad()
def time_depths(depths: list[tuple[str, object, list[int]]], batches: list[dict], rounds: int, log=print) -> dict[str, list[float]]:
    """Seconds of a forward pass over `batches` for each (label, model, skipped positions), in `rounds` rounds, each
    starting one depth later than the one before (a load that drifts within a round falls on every depth)."""
    for _, model, _ in depths:
        model.eval()
    seconds: dict[str, list[float]] = {label: [] for label, _, _ in depths}
    for round_index in range(rounds):
        start = round_index % len(depths)
        for label, model, skipped in depths[start:] + depths[:start]:
            began = time.perf_counter()
            for batch in batches:
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], skipped_positions=skipped, use_cache=False)
            seconds[label].append(time.perf_counter() - began)
            log(f"round {round_index + 1}/{rounds}  {label}: {seconds[label][-1]:.3f} s")
    return seconds


def loops_label(loops: int, trained: int) -> str:
    return f"{loops} loop{'s' if loops > 1 else ''}" + (" (trained)" if loops == trained else "")


def analyse(arguments: LoopDepthArguments) -> Path:
    """Steps 1-4 for `arguments.task`, each finished piece read back; returns the folder of records."""
    task, study = arguments.registered_task, arguments.study_folder()
    choice = choose_row(study_records(study, task), task, study)
    print(f"Chosen by the rule (bench/loop_depth.py's RULE): {choice['label']!r}, mean {choice['metric']} {choice['mean']:.4f} "
          f"over seeds {', '.join(map(str, choice['seeds']))} of {study}")  # fmt: skip
    settings = study_settings(arguments)
    spec = chosen_spec(task, choice["label"])
    study_record = study / spec.directory / RESULT_FILE
    output = arguments.output()
    claim(output, {
        "task": task, "fingerprint": settings.fingerprint(), "smoke": arguments.smoke, "extra_loops": arguments.extra_loops,
        "spec": json.loads(spec.to_json()), "choice": choice,
        # the study's own record of the row at this seed, where it has one: the retrained run should give it again
        "study_record": None if arguments.smoke or not study_record.is_file() else json.loads(study_record.read_text()),
    })  # fmt: skip
    import datasets

    from bench.measure import run, settings_data
    from hf_layertie import TiedGPT2LMHeadModel

    run_dir = output / spec.directory
    model_dir = run_dir / "model"
    progress = tqdm(desc="Inference depth", unit="piece", total=1)  # the run; then each depth and the timing
    if settings.num_threads is not None:
        torch.set_num_threads(settings.num_threads)
    datasets.disable_progress_bars()
    _, splits = settings_data(settings)
    if not (run_dir / RESULT_FILE).is_file() or not model_dir.is_dir():
        progress.write(f"training {spec.label} at seed {spec.seed} into {run_dir}")
        run_dir.mkdir(parents=True, exist_ok=True)
        write_complete(run_dir / RESULT_FILE, run(settings, spec, run_dir, model_dir=model_dir))
    progress.update()
    model = TiedGPT2LMHeadModel.from_pretrained(model_dir).eval()
    segment = LoopSegment.of(model.tying_map.to_list())
    trained_loops = segment.loops
    counts = list(range(1, trained_loops + arguments.extra_loops + 1))
    progress.total += len(counts) + 1
    models = {}
    for loops in counts:
        built = at_loops(model, segment, loops) if loops > trained_loops else model
        skipped = segment.skipped_at(loops) if loops <= trained_loops else []
        models[loops] = (built, skipped)
        piece = output / "depths" / f"loops-{loops}"
        if not (piece / RESULT_FILE).is_file():
            piece.mkdir(parents=True, exist_ok=True)
            record = {
                "label": f"{spec.label}, {loops_label(loops, trained_loops)}",
                "seed": spec.seed,
                "loops": loops,
                "trained_loops": trained_loops,
                "map": built.tying_map.to_list(),
                "skipped_positions": skipped,
                "block_calls_per_token": len(built.tying_map) - len(skipped),
                "how": "as trained" if loops == trained_loops else "skipped positions" if loops < trained_loops else "positions added",
                "recipe_notes": recipe_notes(model, segment, loops),
                "segment": segment.words(),
                **score(built, settings, splits, skipped),
                **provenance(),
            }
            write_complete(piece / RESULT_FILE, record)
        progress.update()
    timing = output / "timing"
    if not (timing / RESULT_FILE).is_file():
        batches = eval_batches(settings, splits)[: arguments.timing_batches]
        depths = [(loops_label(loops, trained_loops), *models[loops]) for loops in counts]
        load_before = os.getloadavg()[0]
        seconds = time_depths(depths, batches, arguments.rounds, log=progress.write)
        tokens = sum(batch["input_ids"].numel() for batch in batches)
        timing.mkdir(parents=True, exist_ok=True)
        write_complete(timing / RESULT_FILE, {
            "rounds": arguments.rounds, "batches": len(batches), "tokens_per_pass": tokens,
            "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
            "depths": {
                str(loops): {"seconds_by_round": seconds[label], "ms_per_token": 1000 * statistics.median(seconds[label]) / tokens}
                for loops, (label, _, _) in zip(counts, depths)
            },
            **provenance(),
        })  # fmt: skip
    progress.update()
    progress.close()
    return output


# ----- the report -----


def read_records(output: Path) -> dict:
    """Everything the report reads: the folder's settings.json, the run, each depth's score, the timing."""
    claimed = output / "settings.json"
    if not claimed.is_file():
        raise SystemExit(f"{output}: no analysis there (no settings.json): run bench/loop_depth.py --task ... first")
    settings = json.loads(claimed.read_text())
    spec = RunSpec.from_json(json.dumps(settings["spec"]))
    run_file, timing_file = output / spec.directory / RESULT_FILE, output / "timing" / RESULT_FILE
    depths = sorted((json.loads(path.read_text()) for path in output.glob(f"depths/loops-*/{RESULT_FILE}")), key=lambda record: record["loops"])
    return {
        "settings": settings,
        "run": json.loads(run_file.read_text()) if run_file.is_file() else None,
        "depths": depths,
        "timing": json.loads(timing_file.read_text()) if timing_file.is_file() else None,
    }


def report_payload(records: dict) -> dict:
    """The report's JSON: the choice, the run, and one row per depth with its score and cost."""
    settings, run, timing = records["settings"], records["run"], records["timing"]
    metric = "test_loss" if settings["choice"]["metric"] == "validation_loss" else "mean_accuracy"
    rows = []
    for depth in records["depths"]:
        timed = (timing or {}).get("depths", {}).get(str(depth["loops"]))
        rows.append({
            "loops": depth["loops"], "how": depth["how"], "block_calls_per_token": depth["block_calls_per_token"],
            "map": depth["map"], "skipped_positions": depth["skipped_positions"], metric: depth[metric],
            "ms_per_token": timed["ms_per_token"] if timed else None, "recipe_notes": depth["recipe_notes"],
        })  # fmt: skip
        if "accuracy_by_hops" in depth:  # k-hop: which lookups a depth still does, not only how many
            rows[-1]["accuracy_by_hops"] = depth["accuracy_by_hops"]
    study = settings.get("study_record")
    return {
        "task": settings["task"],
        "smoke": settings["smoke"],
        "choice": settings["choice"],
        "seed": settings["spec"]["seed"],
        "metric": metric,
        "segment": records["depths"][0]["segment"] if records["depths"] else None,
        "run": None if run is None else {name: run.get(name) for name in ("label", "final_map", "validation_loss", "test_loss", "validation_mean_accuracy", "mean_accuracy", "trained_steps", "commit", "hardware")},
        "study_record": None if study is None else {name: study.get(name) for name in (metric, "commit")},
        "timing": None if timing is None else {name: timing[name] for name in ("rounds", "batches", "tokens_per_pass", "load_average_before", "load_average_after", "hardware", "commit")},
        "rows": rows,
    }


def markdown(payload: dict, records: list[dict]) -> str:
    choice, metric, run = payload["choice"], payload["metric"], payload["run"]
    measure = "test loss (nats per token)" if metric == "test_loss" else "mean test accuracy over hop counts"
    chosen_on = "mean validation loss" if choice["metric"] == "validation_loss" else "mean validation accuracy"
    command = f"python bench/loop_depth.py --task {'language' if payload['task'] == 'language' else 'hop'}"
    lines = [
        f"Inference depth of the loop study's task `{payload['task']}` (issue 76, item 4; the pre-registration's analysis "
        f"after the runs, not a hypothesis: no verdict), `{command}`"
        + (" at tiny sizes (`--smoke true`): a check that the command works, no finding." if payload["smoke"] else "."),
        "",
        f"The row: {choice['rule']}. Chosen: **{choice['label']}**, on seeds {', '.join(map(str, choice['seeds']))}.",
        "",
        f"| looped row | seeds | {chosen_on} |",
        "|---|---|---|",
    ]
    for candidate in choice["candidates"]:
        name = f"**{candidate['label']}** (chosen)" if candidate["label"] == choice["label"] else candidate["label"]
        mean = f"{candidate['mean']:.4f}" if choice["metric"] == "validation_loss" else f"{candidate['mean']:.3f}"
        lines.append(f"| {name} | {', '.join(map(str, candidate['seeds']))} | {mean} |")
    lines += ["", f"Trained again at seed {payload['seed']} through the study's own run (bench/measure.py), its weights kept"]
    if run is not None:
        study = payload["study_record"]
        beside = f"; the study's own record of this row and seed: {study[metric]:.4f}" if study and study.get(metric) is not None else ""
        lines[-1] += f": {run['trained_steps']} steps, {measure} {run[metric]:.4f}{beside}."
    if payload["segment"]:
        lines += ["", f"What a loop is: {payload['segment']}. Fewer loops skip the last ones (`skipped_positions`); more "
                  "loops load the checkpoint into the same tied class with a map repeating the segment more times."]  # fmt: skip
    lines += [
        "",
        "Block calls per token: the positions a forward pass computes. ms per token: the wall time of a forward pass "
        "over the same test batches divided by their tokens, every depth timed in one process, in rounds (each one "
        "depth later than the one before), the median over rounds.",
        "",
    ]
    hops = sorted({hop for row in payload["rows"] for hop in row.get("accuracy_by_hops", {})}, key=int)
    lines += [
        f"| loops | how | block calls per token | {measure} | " + "".join(f"{hop} hop{'s' if hop != '1' else ''} | " for hop in hops) + "ms per token |",
        "|---|---|---|---|" + "---|" * len(hops) + "---|",
    ]
    for row in payload["rows"]:
        value = f"{row[metric]:.4f}" if metric == "test_loss" else f"{row[metric]:.3f}"
        by_hops = "".join(f"{row['accuracy_by_hops'][hop]:.3f} | " for hop in hops)  # every depth scores the same split
        ms = "" if row["ms_per_token"] is None else f"{row['ms_per_token']:.4f}"
        lines.append(f"| {row['loops']} | {row['how']} | {row['block_calls_per_token']} | {value} | {by_hops}{ms} |")
    notes = {note: [row["loops"] for row in payload["rows"] if note in row["recipe_notes"]] for row in payload["rows"] for note in row["recipe_notes"]}
    if notes:
        lines += ["", "Where the loop recipe makes another depth other than the trained model run shorter or longer:", ""]
        lines += [f"- at {', '.join(map(str, loops))} loop{'s' if loops != [1] else ''}: {note}" for note, loops in notes.items()]
    timing = payload["timing"]
    if timing is not None:
        lines += ["", f"Timing: {timing['rounds']} rounds of {timing['batches']} test batch{'es' if timing['batches'] > 1 else ''} ({timing['tokens_per_pass']:,} tokens) per depth; "
                  f"hardware: {timing['hardware']}; 1-minute load average {timing['load_average_before']:.2f} before, "
                  f"{timing['load_average_after']:.2f} after; commit {timing['commit']}."]  # fmt: skip
    lines += source_lines(records)
    return "\n".join(lines) + "\n"


def write_report(output: Path, report_dir: Path, name: str) -> Path:
    """`<name>.md` and `<name>.json` in `report_dir`, from `output`'s records alone."""
    records = read_records(output)
    payload = report_payload(records)
    measured = [record for record in (records["run"], *records["depths"]) if record is not None]
    report_dir.mkdir(parents=True, exist_ok=True)
    write_whole(report_dir / f"{name}.json", json.dumps(payload, indent=2))
    report = report_dir / f"{name}.md"
    write_whole(report, markdown(payload, measured))
    return report


def main() -> None:
    (arguments,) = HfArgumentParser(LoopDepthArguments).parse_args_into_dataclasses()
    output = arguments.output() if arguments.report_only else analyse(arguments)
    report = write_report(output, arguments.report_folder(), f"inference-depth-{arguments.task}")
    print(f"Report: {report}")
    refresh_after_report(report)


if __name__ == "__main__":
    main()
