"""Compressing a trained model by tying, against the equal-memory alternatives (issue: "Compress a trained model").

    python bench/compress.py --preset tiny      # smoke test, about 4 minutes
    python bench/compress.py                    # the CPU comparison, about 45-50 minutes per seed on one core, and 1.5-2.5 hours more with the distilled rows
    python bench/compress.py --jobs 2           # two runs side by side (a seed's teacher first, then its rows)
    python bench/compress.py --seeds 0,1        # some seeds now, the others later (finished runs are kept)
    python bench/compress.py --preset depth     # the same on k-hop induction, where depth matters (4 blocks to 2)

Per seed: a GPT-2 of the preset's `n_layer` blocks (by default the study's 12 x 64, `bench/settings.py`) is trained
conventionally on the preset's data (the teacher), then every row trains the same number of uptraining steps on the
same batches, with at most `distinct_blocks` blocks owning weights (by default the training memory of a 4-block
model), except the teacher continued (the ceiling) and the rows marked "teacher + uptraining steps", which train
for the teacher's and the uptraining's steps together (the fair "train small" alternative: as many tokens as the
teacher and its conversion saw). Every row is a fresh single-threaded process (its peak memory is its own; the
`tiny` smoke test forks them instead) that writes `result.json` when it finishes; a re-run skips finished runs. The
report (`bench/reports/compress/` by default, `compress/depth/` for `--preset depth`: `results.{json,md}`) pairs
each row with the best row of the "train small" kind by seed (95% t-intervals).

The maps: fixed patterns (`cycle:U`, `sequence:U`), `similarity:U` measured on the loaded teacher (angular
distance, `hf_layertie.block_similarity`), and DLT started from `sequence:U` under a cap of U, its untied blocks
given back their own trained weights (`untie_init="own"`) or a copy of their source's (`"source"`, the paper).
Each with `tie_init` root and mean where it applies; and the teacher cut down to U of its own blocks (its first U,
or the U that `similarity:U` keeps). Relaxed ties (`lora_rank`, `hf_layertie.relaxed_ties`): the best fixed
map with a LoRA per position, started from what the tie took from it (`lora_init="svd"`) or from zero, at ranks
2 and 8 (their adapters add to the training state, which the table reports). The Llama rows (seed 0 alone) take
the same path from a plain `LlamaForCausalLM` teacher of the same sizes: the workflow users run on real checkpoints.

Distilled (issue 52; rows ending `, distilled`, GPT-2 alone): the same uptraining with knowledge distillation from
the seed's teacher (`distill_from`, the trainer's default temperature 2 and weight 5/7), for the best conversions
(`sequence:U` and `similarity:U` mean, without and with relaxed ties at rank 8) and for the untied baselines a user
would distil instead: the teacher's first U blocks (Minitron-style depth pruning) and U blocks from scratch, each on
the uptraining's steps and on the teacher's and the uptraining's. The report's "best small" is the
best, on validation loss, of the rows that get U untied blocks without tying (`Row.trains_small`: from scratch, or
cut from the teacher, distilled or not); each row is paired with it, and with the best of those trained for the
row's own steps (`Row.steps`).

This file schedules the runs; the presets, the rows and their folders are `compress_settings.py`, one row's run
`compress_run.py`, the report `compress_report.py`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm
from transformers import HfArgumentParser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.compress_report import write_report  # noqa: E402
from bench.compress_run import run_row  # noqa: E402
from bench.compress_settings import PRESETS, CompressSettings, Row, plan, row_dir, seed_dir, teacher_ready  # noqa: E402
from bench.markdown_tables import refresh_after_report  # noqa: E402
from bench.measure import task_data  # noqa: E402
from bench.provenance import provenance  # noqa: E402
from bench.scheduling import RESULT_FILE, Job, leave_out_of_progress, run_jobs, single_run_command, write_complete  # noqa: E402
from bench.settings import (  # noqa: E402
    PRESETS_DIR,
    REPO_ROOT,
    check_task,
    measured_under,
    parse_integers,
    presets_help,
    with_preset_seeds,
)


@dataclass
class CompressArguments:
    preset: str = field(default="default", metadata={"help": presets_help(PRESETS_DIR / "compress")})
    seeds: str | None = field(default=None, metadata={"help": "Comma-separated seeds (default: the preset's)."})
    task: str | None = field(
        default=None, metadata={"help": "A generated task instead of the preset's data, e.g. 'hop_induction:length=16,max_hops=2'."}
    )
    results_dir: str | None = field(default=None, metadata={"help": "Default: bench/results/compress-<preset>."})
    report_dir: str | None = field(default=None, metadata={"help": "Default: bench/reports/compress (preset default), else the results dir."})
    report_only: bool = field(default=False, metadata={"help": "Write the report from finished runs; train nothing."})
    jobs: int = field(default=1, metadata={"help": "Runs side by side, each a single-threaded process (CPU)."})
    single_run: str | None = field(default=None, metadata={"help": "Internal: the row label and seed this process runs."})

    def __post_init__(self) -> None:
        """Every flag checked before anything runs, each error naming its flag."""
        if self.preset not in PRESETS:
            raise ValueError(f"--preset {self.preset!r}: expected one of {', '.join(PRESETS)}")
        if self.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.jobs}")
        if self.seeds is not None:
            parse_integers(self.seeds, "seeds")
        check_task(self.task)

    def settings(self) -> CompressSettings:
        settings = PRESETS[self.preset]
        if self.seeds is not None:
            settings = dataclasses.replace(settings, seeds=parse_integers(self.seeds, "seeds"))
        if self.task is not None:
            settings = dataclasses.replace(settings, task=self.task)
        return settings

    def output(self) -> Path:
        return Path(self.results_dir) if self.results_dir else REPO_ROOT / "bench" / "results" / f"compress-{self.preset}"

    def report(self) -> Path:
        """bench/reports/compress[/<preset>] for the presets' own runs; beside the runs for tiny, another results dir or task."""
        if self.report_dir:
            return Path(self.report_dir)
        if self.preset == "tiny" or self.results_dir or self.task is not None:
            return self.output()
        return REPO_ROOT / "bench" / "reports" / "compress" / ("" if self.preset == "default" else self.preset)


def main() -> None:
    (args,) = HfArgumentParser(CompressArguments).parse_args_into_dataclasses()
    settings, output = args.settings(), args.output()
    if args.single_run is not None:
        label, seed = json.loads(args.single_run)
        row = next(row for row in plan(settings) if row.label == label)
        run_dir = row_dir(output, row, seed)
        source = provenance()  # the code this process loaded, not what the tree holds when the row ends
        write_complete(run_dir / RESULT_FILE, {**run_row(settings, row, seed, run_dir, seed_dir(output, seed)), **source})
        return
    _claim(output, settings)
    failures = [] if args.report_only else _run_all(settings, output, args.jobs)
    reported = with_preset_seeds(settings, PRESETS[args.preset])
    report = write_report(reported, plan(reported), output, args.report())
    print(f"\nReport: {report}")
    refresh_after_report(report)
    if failures:
        sys.exit(f"{len(failures)} run(s) failed, see their log.txt:\n" + "\n".join(failures))


def _claim(output: Path, settings: CompressSettings) -> None:
    if settings.task is not None:
        task_data(settings.task, settings.block_size)  # a bad config, or a task too long for the context, fails here
    output.mkdir(parents=True, exist_ok=True)
    settings_file = output / "settings.json"
    if settings_file.is_file() and not measured_under(output, settings):
        raise SystemExit(f"{output} holds runs measured with other settings ({settings_file}); pass another --results_dir")
    settings_file.write_text(json.dumps({"fingerprint": settings.fingerprint()}, indent=2))


def _run_all(settings: CompressSettings, output: Path, jobs: int) -> list[str]:
    """Every row and seed without a result, seed by seed, `jobs` single-threaded processes side by side."""
    todo = [(row, seed) for seed in settings.seeds for row in plan(settings) if row.seeds is None or seed in row.seeds]
    with tqdm(total=len(todo), desc="Compression runs", unit="run") as progress:
        queue = _RowQueue(output, todo, progress, forked=settings.smoke_test)
        run_jobs(queue.next_job, queue.finished, jobs)
    return queue.failures


def _family(row: Row, seed: int) -> tuple[int, str]:
    """The rows that start from one teacher: a seed's rows of one model family."""
    return seed, row.model_type


class _RowQueue:
    """The rows to run, in order. A row that reads its seed's teacher (starts from it or distils from it,
    `Row.needs_teacher`) while that teacher is missing trains it first (`compress_run.run_row`), so while it runs
    the other such rows of its seed and family wait; if it ends without a teacher, they are reported not run."""

    def __init__(self, output: Path, todo: list[tuple[Row, int]], progress: tqdm, forked: bool = False):
        self.output, self.progress, self.failures, self.forked = output, progress, [], forked
        self.queue = [item for item in todo if not (row_dir(output, *item) / RESULT_FILE).is_file()]
        if finished_before := len(todo) - len(self.queue):
            leave_out_of_progress(progress, finished_before, finished_before)
        self.training_teacher: set[tuple[int, str]] = set()  # (seed, family) whose teacher a running row trains

    def next_job(self) -> Job | None:
        """The first queued row that need not wait for a teacher; None while every one of them does."""
        ready = next((item for item in self.queue if not item[0].needs_teacher or _family(*item) not in self.training_teacher), None)
        if ready is None:
            return None
        self.queue.remove(ready)
        row, seed = ready
        if row.needs_teacher and not teacher_ready(seed_dir(self.output, seed), row.model_type):
            self.training_teacher.add(_family(row, seed))
        command = single_run_command(Path(__file__).resolve(), json.dumps([row.label, seed]))
        env = {"OMP_NUM_THREADS": "1"}
        return Job(f"{row.label} seed {seed}", row_dir(self.output, row, seed), command, env, payload=(row, seed), forked=self.forked)

    def finished(self, job: Job, returncode: int) -> None:
        row, seed = job.payload
        self.progress.update()
        if returncode != 0:
            self.failures.append(job.failure(returncode))
        else:
            result = json.loads((job.run_dir / RESULT_FILE).read_text())
            self.progress.write(f"seed {seed} {row.label}: test loss {result['test_loss']:.4f}, {result['train_seconds']:.0f} s")
        family = _family(row, seed)
        if family in self.training_teacher:
            self.training_teacher.remove(family)
            if not teacher_ready(seed_dir(self.output, seed), row.model_type):
                self._drop_waiting(family)

    def _drop_waiting(self, family: tuple[int, str]) -> None:
        waiting = [(row, seed) for row, seed in self.queue if row.needs_teacher and _family(row, seed) == family]
        for row, seed in waiting:
            self.queue.remove((row, seed))
            self.failures.append(f"{row.label} seed {seed}: not run, the run that trains its teacher failed")
            self.progress.update()


if __name__ == "__main__":
    main()
