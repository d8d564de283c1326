#!/usr/bin/env python
"""Time per training step of each layout of a partial-loop preset, timed side by side in one process.

    python bench/step_time.py --preset partial-depth   # k-hop induction: 3 untied blocks, and 3 looped over 4-6 positions
    python bench/step_time.py --preset partial         # language: 4 untied blocks, and 4 looped over 5-8 positions

A looped layout trains the parameters of U untied blocks but computes more positions, so it costs time per step where
it saves nothing in memory. What a step costs is the positions it computes, not the model's length: each layout of
the most positions is timed a second time with its repeated positions skipped (`config.skipped_positions`, as
`--loop_onset` trains before its onset), the rows `..., repeats skipped`, whose active positions are U. The study's reports give `s per step` as a run's training time over its steps, which counts
whatever else the machine ran meanwhile (a run beside it on 2 cores, a test suite): rows trained at different times
are not comparable there. Here each layout of the preset (`partial_loop_runs`) trains a few steps through the study's
own path (`TyingTrainer`, the preset's data, model, batch and optimizer, one thread, as each study run has) in
rounds: a round times every layout in turn, so that a change of load between rounds reaches every layout alike. A
layout's ratio to `untied, U blocks` is taken within each round, and the median over rounds is reported with its
lowest and highest. A step is timed from `on_step_begin` to `on_step_end` (forward, backward, clipping, the
optimizer's step), after `--warmup_steps` untimed ones, and a layout's time in a round is the median of its timed
steps. The machine's load average is recorded before and after.

Writes `step_time.json` and `step_time.md` into `--output_dir` (default: the preset's report folder,
bench/reports/study/<preset>, beside the study's results.json, which it does not touch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import datasets
import torch
from transformers import HfArgumentParser, PrinterCallback, TrainerCallback, default_data_collator, set_seed

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.markdown_tables import refresh_markdown  # noqa: E402
from bench.measure import build_model, settings_data, training_arguments  # noqa: E402
from bench.provenance import provenance  # noqa: E402
from bench.settings import PRESETS, BenchSettings, RunSpec, partial_loop_runs, untied_label  # noqa: E402
from hf_layertie import TyingTrainer  # noqa: E402

LOOP_PRESETS = tuple(name for name, settings in PRESETS.items() if settings.partial_loops)


@dataclass
class StepTimeArguments:
    """Flags of `bench/step_time.py`."""

    preset: Literal[LOOP_PRESETS] = field(
        default="partial-depth", metadata={"help": "The study preset whose layouts are timed (one with partial loops)."}
    )
    steps: int = field(default=20, metadata={"help": "Timed steps per layout and round."})
    warmup_steps: int = field(default=3, metadata={"help": "Untimed steps before them, per layout and round."})
    rounds: int = field(default=5, metadata={"help": "Rounds, each timing every layout in turn."})
    output_dir: str | None = field(
        default=None, metadata={"help": "Where step_time.json and .md go. Default: bench/reports/study/<preset>."}
    )

    def __post_init__(self):
        for name in ("steps", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup_steps must be >= 0, got {self.warmup_steps}")


class StepTimer(TrainerCallback):
    """The wall time of every optimizer step, from `on_step_begin` to `on_step_end`."""

    def __init__(self):
        self.seconds: list[float] = []
        self._started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._started)


@dataclass(frozen=True)
class TimedLayout:
    """A layout of the preset, computing every position or with its repeated positions skipped."""

    spec: RunSpec
    skips_repeats: bool = False

    @property
    def label(self) -> str:
        return f"{self.spec.label}, repeats skipped" if self.skips_repeats else self.spec.label


def timed_layouts(settings: BenchSettings) -> list[TimedLayout]:
    """Every layout of the preset's partial loops, then those of the most positions with their repeats skipped."""
    specs = partial_loop_runs(settings, seed=settings.seeds[0])
    longest = max(spec.num_blocks for spec in specs)
    return [TimedLayout(spec) for spec in specs] + [TimedLayout(spec, True) for spec in specs[1:] if spec.num_blocks == longest]


def median_step_seconds(
    settings: BenchSettings, layout: TimedLayout, splits, tokenizer, arguments: StepTimeArguments
) -> tuple[float, list[int], list[int] | None]:
    """Train `layout` for the warm-up and timed steps: the median of the timed steps' seconds, the map the model
    trained with and the positions it skipped (what was timed)."""
    spec = layout.spec
    with tempfile.TemporaryDirectory() as scratch:
        training = training_arguments(settings, spec, Path(scratch))
        training = dataclasses.replace(training, max_steps=arguments.warmup_steps + arguments.steps, logging_strategy="no")
        set_seed(spec.seed)
        model = build_model(tokenizer, spec.num_blocks or settings.n_layer, settings.n_embd, settings.n_head, settings.block_size, settings.dropout)
        trainer = TyingTrainer(model=model, args=training, train_dataset=splits["train"], data_collator=default_data_collator)
        if layout.skips_repeats:
            model.config.skipped_positions = [position for position, seen in enumerate(model.tying_map.occurrences()) if seen]
        timer = StepTimer()
        trainer.add_callback(timer)
        trainer.remove_callback(PrinterCallback)  # each short run's closing metrics say nothing here
        trainer.train()
    return statistics.median(timer.seconds[arguments.warmup_steps :]), model.tying_map.to_list(), model.config.skipped_positions


def measure(settings: BenchSettings, arguments: StepTimeArguments) -> dict:
    """Every layout of `settings`' partial loops timed in `arguments.rounds` rounds: the JSON-ready payload."""
    layouts = timed_layouts(settings)
    untied = untied_label(settings)
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    source = provenance()  # the code this process loaded, not what the tree holds at its end
    tokenizer, splits = settings_data(settings)
    load_before = os.getloadavg()
    rounds, maps, skipped = [], {}, {}
    for round_index in range(arguments.rounds):
        seconds = {}
        start = round_index % len(layouts)  # each round starts one layout later: none is always timed first or last
        for layout in layouts[start:] + layouts[:start]:
            label = layout.label
            seconds[label], maps[label], skipped[label] = median_step_seconds(settings, layout, splits, tokenizer, arguments)
            print(f"round {round_index + 1}/{arguments.rounds}  {label}: {seconds[label]:.4f} s per step", flush=True)
        rounds.append(seconds)
    rows = {}
    for layout in layouts:
        label = layout.label
        ratios = [seconds[label] / seconds[untied] for seconds in rounds]
        positions = len(maps[label])
        active = positions - len(skipped[label] or [])
        rows[label] = {
            "positions": positions,
            "active_positions": active,
            "skipped_positions": skipped[label],
            "map": maps[label],
            "seconds_per_step": statistics.median(seconds[label] for seconds in rounds),
            "ratio_to_untied": statistics.median(ratios),
            "ratio_lowest": min(ratios),
            "ratio_highest": max(ratios),
            "positions_ratio": active / settings.max_distinct_blocks,
            "seconds_by_round": [seconds[label] for seconds in rounds],
        }
    return {
        "preset": arguments.preset,
        "untied": untied,
        "steps": arguments.steps,
        "warmup_steps": arguments.warmup_steps,
        "rounds": arguments.rounds,
        "batch": [settings.batch_size, settings.block_size],
        "load_average_before": load_before[0],
        "load_average_after": os.getloadavg()[0],
        "hardware": source["hardware"],
        "commit": source["commit"],
        "rows": rows,
    }


def markdown(payload: dict) -> str:
    lines = [
        f"Seconds per training step of preset `{payload['preset']}`'s layouts, timed side by side in one process "
        f"(`python bench/step_time.py --preset {payload['preset']}`): {payload['rounds']} rounds, each timing every "
        f"layout in turn, starting one layout later than the round before, for {payload['steps']} steps of {payload['batch'][0]} x {payload['batch'][1]} tokens after "
        f"{payload['warmup_steps']} untimed ones, one thread. Ratio: a layout's median step over `{payload['untied']}`'s "
        "in the same round, median over rounds (lowest, highest). Active: the positions a step computes (all but "
        "those skipped); positions ratio: the active positions over the untied model's blocks. "
        f"Hardware: {payload['hardware']}; 1-minute load average {payload['load_average_before']:.2f} "
        f"before, {payload['load_average_after']:.2f} after. Commit {payload['commit']}.",
        "",
        "| layout | positions | active | s per step | ratio to untied | lowest | highest | positions ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, row in payload["rows"].items():
        lines.append(
            f"| {label} | {row['positions']} | {row['active_positions']} | {row['seconds_per_step']:.4f} | {row['ratio_to_untied']:.2f} | "
            f"{row['ratio_lowest']:.2f} | {row['ratio_highest']:.2f} | {row['positions_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    (arguments,) = HfArgumentParser(StepTimeArguments).parse_args_into_dataclasses()
    output = Path(arguments.output_dir) if arguments.output_dir else REPO_ROOT / "bench" / "reports" / "study" / arguments.preset
    payload = measure(PRESETS[arguments.preset], arguments)
    output.mkdir(parents=True, exist_ok=True)
    (output / "step_time.json").write_text(json.dumps(payload, indent=1) + "\n")
    (output / "step_time.md").write_text(markdown(payload))
    print(markdown(payload))
    if arguments.output_dir is None:
        refresh_markdown()


if __name__ == "__main__":
    main()
