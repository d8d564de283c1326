"""The study: learned tying against conventional training, random, similarity and static sharing at one budget.

    python bench/run_bench.py --preset tiny                # smoke test, about 2 minutes
    python bench/run_bench.py --preset default --jobs 2    # the CPU study: 10 seeds x 19 runs of 2-5 minutes, about 7 hours on 2 cores
    python bench/run_bench.py --preset depth --jobs 2      # k-hop induction, where depth matters: 5 seeds x 15 runs of 6 minutes
    python bench/run_bench.py --preset depth-fresh --jobs 2   # fresh seeds 5-14 under the recipe chosen on seeds 0-4
    python bench/run_bench.py --help                       # every flag

Every (strategy, seed) run is a fresh single-threaded Python process (its peak memory is its own) that writes
`runs/.../result.json` when it finishes; a re-run skips finished runs, so the study can be built up over several
sittings, and `--report_only` rewrites the report from whatever has finished. See bench/README.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm.auto import tqdm
from transformers import HfArgumentParser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loop_report import loop_study_markdown  # noqa: E402
from bench.markdown_tables import refresh_after_report  # noqa: E402
from bench.measure import count_bigram_test_loss, missing_device, run, task_data  # noqa: E402
from bench.report import LEARNING_RATES_FILE, load_result, read_learning_rates, write_learning_rates, write_report  # noqa: E402
from bench.scheduling import RESULT_FILE, Job, leave_out_of_progress, run_jobs, single_run_command, write_complete  # noqa: E402
from bench.settings import (  # noqa: E402
    PRESETS,
    BenchArguments,
    BenchSettings,
    RunSpec,
    at_learning_rate,
    at_learning_rates,
    core_runs,
    freeze_recipe,
    grid_seed,
    measured_under,
    memory_runs,
    parse_learning_rates,
    parse_rows,
    preregistered,
    report_dir,
    resolve_settings,
    results_dir,
    run_tiers,
    runs_after,
    with_preset_seeds,
)


def main() -> None:
    (args,) = HfArgumentParser(BenchArguments).parse_args_into_dataclasses()
    output = results_dir(args)
    settings = freeze_recipe(resolve_settings(args), args, output)
    if args.single_run is not None:
        single_run(settings, RunSpec.from_json(args.single_run), output)
        return
    # Before claiming the folder: a bad flag leaves nothing behind.
    rows = parse_rows(args.rows, settings)
    tuning = read_learning_rates(Path(args.learning_rates_from or output)) if args.tuned_learning_rates else None
    if args.learning_rates_from is not None and tuning is None:
        raise SystemExit(f"--learning_rates_from {args.learning_rates_from}: no {LEARNING_RATES_FILE} there")
    if not args.report_only and (problem := missing_device(settings)):
        raise SystemExit(problem)
    if settings.loop_study is not None or settings.addendum is not None:
        check_registered(settings, args)
    claim_results_dir(output, settings)
    if args.tune_learning_rates is not None:
        grid = parse_learning_rates(args.tune_learning_rates)
        # Strategy by strategy, each at every rate, so that a tuning stopped early has whole grids for its first ones;
        # the controls take their strategy's rate (control_runs).
        grid_runs = [at_learning_rate(spec, rate, settings) for spec in core_runs(settings, grid_seed(settings)) for rate in grid]
        failures = []
        if not args.report_only:
            scheduler = Scheduler(settings, output, args.jobs, with_memory=False, with_study=False)
            scheduler.queue = list(enumerate(spec for spec in grid_runs if rows is None or spec.label in rows))
            failures = scheduler.run()
        # From every row's finished grid, `--rows` or not: the rows not trained now keep the rates they chose before.
        print(f"\nLearning rates: {write_learning_rates(output, settings, grid, grid_runs)}")
        if failures:
            sys.exit(f"{len(failures)} run(s) failed, see their log.txt:\n" + "\n".join(failures))
        return
    learning_rates = tuning["chosen"] if tuning is not None else None
    with_memory = not args.skip_memory and rows is None
    failures = [] if args.report_only else Scheduler(settings, output, args.jobs, with_memory, not args.memory_only, learning_rates, rows).run()
    markdown = loop_study_markdown if settings.loop_study is not None else None
    report = write_report(with_preset_seeds(settings, preregistered(PRESETS[args.preset])), output, tuning, report_dir(args), markdown)
    print(f"\nReport: {report}")
    refresh_after_report(report)
    if failures:
        sys.exit(f"{len(failures)} run(s) failed, see their log.txt:\n" + "\n".join(failures))


def claim_results_dir(output: Path, settings: BenchSettings) -> None:
    """Record the settings beside the runs; refuse a folder whose finished runs were measured under others."""
    output.mkdir(parents=True, exist_ok=True)
    settings_file = output / "settings.json"
    if settings_file.is_file():
        if not measured_under(output, settings):
            raise SystemExit(
                f"{output} holds runs measured with other settings ({settings_file}); pass another --results_dir, "
                "or delete that folder to start over"
            )
        return
    if settings.task is not None:
        task_data(settings.task, settings.block_size)  # a bad config, or a task too long for the context, fails here
    baselines = {"bigram_test_loss": count_bigram_test_loss(settings)}  # also fills the tokenization cache
    settings_file.write_text(json.dumps({"fingerprint": settings.fingerprint(), "baselines": baselines}, indent=2))


def check_registered(settings: BenchSettings, args: BenchArguments) -> None:
    """A pre-registered study's runs, or an addendum's: at the rates the preset registered (no grid, no other
    folder's rates), and none before its registration is committed as it is (one error, before the folder is
    claimed, rather than one per run from measure.py)."""
    for flag in ("tune_learning_rates", "learning_rates_from"):
        if getattr(args, flag) is not None:
            raise SystemExit(f"--{flag}: a pre-registered preset trains every row at its registered rate")
    if not args.report_only:
        try:
            settings.registration_commit()
        except ValueError as error:
            raise SystemExit(str(error)) from None


def single_run(settings: BenchSettings, spec: RunSpec, output: Path) -> None:
    """One run of the plan, into the folder claimed under these settings (a run resolved under other ones, e.g. a
    pre-registration committed again since the folder was claimed, is refused)."""
    claim_results_dir(output, settings)
    run_dir = output / spec.directory
    write_complete(run_dir / RESULT_FILE, run(settings, spec, run_dir))


class Scheduler:
    """Runs the plan in tiers, each seed by seed, `jobs` processes at a time: every seed's equal-memory runs, then
    every seed's other strategies, then every seed's controls; the runs that need a run's outcome (static layouts at
    DLT's budget, final maps from scratch) are queued when it has finished, before the next seed's. `rows`: only the
    runs of these labels, without followers."""

    def __init__(
        self,
        settings: BenchSettings,
        output: Path,
        jobs: int,
        with_memory: bool,
        with_study: bool = True,
        learning_rates: dict[str, float] | None = None,
        rows: frozenset[str] | None = None,
    ):
        self.settings, self.output, self.jobs, self.learning_rates = settings, output, jobs, learning_rates
        self.rows = rows
        self.queue: list[tuple[float, RunSpec]] = []
        seeds = settings.seeds if with_study else ()
        for tier_index, runs_of in enumerate(run_tiers(settings)):
            for seed_index, seed in enumerate(seeds):
                specs = [spec for spec in runs_of(settings, seed) if rows is None or spec.label in rows]
                self.queue += [(tier_index * len(seeds) + seed_index, spec) for spec in at_learning_rates(specs, learning_rates, settings)]
        if with_memory:  # after the first seed: the memory figures do not wait for the whole study
            self.queue += [(0.5, spec) for spec in memory_runs(settings)]
        self.queue.sort(key=lambda item: item[0])  # stable: the plan's order within a seed
        self.seen: set[str] = set()
        self.failures: list[str] = []
        self.finished_before = 0

    def run(self) -> list[str]:
        self.progress = tqdm(desc="Study runs", unit="run", total=len(self.queue))
        try:
            run_jobs(self._next_job, self._finish, self.jobs)
        finally:
            self.progress.close()
        return self.failures

    def _next_job(self) -> Job | None:
        """The queue's next run without a result; a finished one on the way still queues the runs it makes possible."""
        while self.queue:
            order, spec = self.queue.pop(0)
            if spec.directory in self.seen:  # one run serves two labels (e.g. equal final and mean budgets)
                self.progress.total -= 1
                continue
            self.seen.add(spec.directory)
            run_dir = self.output / spec.directory
            if (run_dir / RESULT_FILE).is_file():
                self.finished_before += 1
                leave_out_of_progress(self.progress, 1, self.finished_before)
                self._after(order, spec)
                continue
            threads = {"OMP_NUM_THREADS": str(self.settings.num_threads)} if self.settings.num_threads else {}
            command = single_run_command(Path(__file__).resolve(), spec.to_json())
            env = {"TOKENIZERS_PARALLELISM": "false", **threads}
            forked = self.settings.fork_runs and spec.kind != "memory"  # a memory run's peak is a fresh process's
            return Job(f"{spec.label} seed {spec.seed}", run_dir, command, env, payload=(order, spec), forked=forked)
        return None

    def _finish(self, job: Job, returncode: int) -> None:
        order, spec = job.payload
        self.progress.update()
        if returncode != 0:
            self.failures.append(job.failure(returncode))
            return
        result = load_result(job.run_dir)
        loss = f", test loss {result['test_loss']:.4f}" if "test_loss" in result else ""
        loss += f", mean accuracy {result['mean_accuracy']:.3f}" if "mean_accuracy" in result else ""
        self.progress.write(f"{spec.kind} {spec.label} seed {spec.seed}: {result['train_seconds']:.0f} s{loss}")
        self._after(order, spec)

    def _after(self, order: float, spec: RunSpec) -> None:
        """Queue the runs a finished DLT or random run of the study makes possible, before the next seed's runs."""
        if spec.kind != "study" or self.rows is not None:
            return
        followers = runs_after(spec, load_result(self.output / spec.directory), self.settings, self.learning_rates)
        if not followers:
            return
        position = next((i for i, (other, _) in enumerate(self.queue) if other > order), len(self.queue))
        self.queue[position:position] = [(order, follower) for follower in followers]
        self.progress.total += len(followers)


if __name__ == "__main__":
    main()
