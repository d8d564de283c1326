"""What `bench/compress.py` compares, on what, for how long: its presets, its rows and where each run is kept.

Its own module, as `bench/settings.py` is the study's: the scheduler (`compress.py`), a row's run (`compress_run.py`)
and the report (`compress_report.py`) all read it, and so none of them imports another for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .settings import LATER_SETTINGS, PRESETS_DIR, fingerprint, read_presets


@dataclass(frozen=True)
class CompressSettings:
    n_layer: int
    n_embd: int
    n_head: int
    block_size: int
    batch_size: int
    teacher_steps: int
    teacher_learning_rate: float
    uptrain_steps: int
    uptrain_learning_rate: float
    warmup_steps: int
    distinct_blocks: int
    tying_interval: int
    max_test_blocks: int | None
    seeds: tuple[int, ...]
    task: str | None = None  # a generated task instead of the plays (`bench/settings.py`, BenchSettings.task)
    # Cap on the validation blocks evaluated (the study's `max_validation_blocks`): a smoke test's rows of seconds
    # would otherwise spend most of them on the whole validation split.
    max_validation_blocks: int | None = None
    # Which distilled rows run, not what any row measures (so, like the seeds, not in the fingerprint): all of them,
    # or for a smoke test one conversion and one baseline (`_distilled_rows`); a smoke test's runs of seconds are
    # also forked from a process that imported the libraries once (bench/scheduling.py's forked runs).
    smoke_test: bool = False

    def fingerprint(self) -> str:
        return fingerprint(self, scheduling=("seeds", "smoke_test"), later=LATER_SETTINGS | COMPRESS_LATER_SETTINGS)


# Fields added after compress runs were recorded, with the value that behaves as before (as `LATER_SETTINGS` for the
# study's; `max_validation_blocks` is not one of those, since the study's folders have it in their fingerprints).
COMPRESS_LATER_SETTINGS = {"max_validation_blocks": None}


# The steps of a row that spends only the uptraining's (`Row.steps`): the conversions' budget.
UPTRAINING_STEPS = "uptraining steps"

# Each family's teacher, saved in its seed's folder as a plain transformers checkpoint (`to_untied()`): conversions
# load it as users load theirs (`load_model`, as `run_clm.py --model_name_or_path` does).
TEACHER_DIRS = {"tied_gpt2": "teacher-model", "tied_llama": "teacher-llama"}

# Its presets (bench/presets/compress), read as the study's are.
PRESETS: dict[str, CompressSettings] = read_presets(PRESETS_DIR / "compress", CompressSettings)


@dataclass(frozen=True)
class Row:
    """One row of the table. `start`: "teacher" (converted), "truncated" (its first blocks), "pruned" (the blocks
    `similarity:U` keeps independent, in order: block 0 and the U - 1 that change their input most), "scratch".
    `distill`: trained with knowledge distillation from its seed's teacher of its family (`distill_from`, the
    trainer's default temperature and weight), whatever it starts from."""

    label: str
    start: str
    strategy: str = "none"
    tie_init: str | None = None
    untie_init: str | None = None
    all_tokens: bool = False  # from scratch for the teacher's steps and the uptraining's
    lora_rank: int | None = None  # relaxed ties
    lora_init: str | None = None
    model_type: str = "tied_gpt2"  # the family: every row of a family starts from that family's teacher
    seeds: tuple[int, ...] | None = None  # only these of the preset's seeds (None: all)
    distill: bool = False  # knowledge distillation from the seed's teacher

    def __post_init__(self) -> None:
        if self.start in ("truncated", "pruned") and self.model_type != "tied_gpt2":
            raise ValueError(f"row {self.label!r}: cutting the teacher down (start {self.start!r}) is built for GPT-2 teachers only, not {self.model_type}")

    @property
    def directory(self) -> str:
        return "".join(character if character.isalnum() else "-" for character in self.label).strip("-")

    @property
    def needs_teacher(self) -> bool:
        """Whether the row reads its seed's teacher: it starts from it, or distils from it."""
        return self.start != "scratch" or self.distill

    @property
    def steps(self) -> str:
        """The steps it trains for, as the report pairs rows "at the same steps": a user who holds the trained model
        and spends the uptraining's steps, or one who spends the teacher's steps on the small model as well."""
        return "teacher + uptraining steps" if self.all_tokens else UPTRAINING_STEPS

    @property
    def trains_small(self) -> bool:
        """Whether the row is a way of getting the small model without tying, that the report's "best small" is
        chosen among: U untied blocks from scratch, or cut from the teacher (its first blocks, Minitron-style, or
        those `similarity:U` keeps), with or without distillation."""
        return self.start in ("scratch", "truncated", "pruned")


def plan(settings: CompressSettings) -> list[Row]:
    """The rows, in the order they are queued and reported (a seed's teacher is trained by the first row that reads
    it, and rows that need no teacher may start while others wait for it: `compress._RowQueue`)."""
    budget = settings.distinct_blocks
    rows = [Row(f"teacher, {settings.n_layer} blocks, continued (ceiling)", "teacher")]
    for pattern in ("cycle", "sequence", "similarity"):
        strategy = f"similarity:{budget}" if pattern == "similarity" else f"static:{pattern}:{budget}"
        rows += [Row(f"converted, {pattern}, {init}", "teacher", strategy, tie_init=init) for init in ("root", "mean")]
    rows += [
        Row(f"converted, dlt from sequence, mean, untie to {untie}", "teacher", "dlt", tie_init="mean", untie_init=untie)
        for untie in ("own", "source")
    ]
    sequence, similarity = f"static:sequence:{budget}", f"similarity:{budget}"
    relaxed = [(sequence, 2, "svd"), (sequence, 8, "svd"), (sequence, 8, "zero"), (similarity, 8, "svd")]
    rows += [_relaxed_row(strategy, rank, init) for strategy, rank, init in relaxed]
    rows += [
        Row(f"teacher truncated to its first {budget} blocks", "truncated"),
        Row(f"teacher pruned to the {budget} blocks similarity keeps", "pruned"),
        Row(f"untied {budget} blocks from scratch, uptraining steps", "scratch"),
        Row(f"untied {budget} blocks from scratch, teacher + uptraining steps", "scratch", all_tokens=True),
    ]
    rows += _distilled_rows(budget, settings.smoke_test)
    if settings.task is not None:
        return rows
    # The path users take with real checkpoints: a plain LlamaForCausalLM teacher converted, relaxed and exported.
    # One seed: a check that the workflow runs and what it gives, not a comparison (on the plays alone).
    llama = dict(model_type="tied_llama", seeds=(0,))
    rows += [
        Row(f"Llama: teacher, {settings.n_layer} blocks, continued (ceiling)", "teacher", **llama),
        Row("Llama: converted, sequence, mean", "teacher", sequence, tie_init="mean", **llama),
        _relaxed_row(sequence, 8, "svd", "Llama: ", **llama),
        Row(f"Llama: untied {budget} blocks from scratch, teacher + uptraining steps", "scratch", all_tokens=True, **llama),
    ]
    return rows


def _distilled_rows(budget: int, smoke_test: bool = False) -> list[Row]:
    """Knowledge distillation from the seed's teacher (issue 52): the best conversions distilled (`sequence` and
    `similarity` with `tie_init mean`, without and with relaxed ties at rank 8), as Relaxed Recursive Transformers
    uptrain theirs; and the untied baselines a user would distil instead, the teacher's first blocks (Minitron-style
    depth pruning) and blocks from scratch, each on the uptraining's steps and on the teacher's and the uptraining's
    together (the truncated teacher's longer run last, added after the others had run). New labels (`, distilled`),
    so that the rows above keep their folders and records.
    A smoke test runs two: a relaxed conversion and the baseline from scratch on the uptraining's steps (a row that
    reads the teacher without starting from it)."""
    strategies = (f"static:sequence:{budget}", f"similarity:{budget}")
    conversions = [Row(f"converted, {strategy.split(':')[-2]}, mean", "teacher", strategy, tie_init="mean") for strategy in strategies]
    conversions += [_relaxed_row(strategy, 8, "svd") for strategy in strategies]
    rows = [dataclasses.replace(row, label=f"{row.label}, distilled", distill=True) for row in conversions]
    rows += [
        Row(f"teacher truncated to its first {budget} blocks, distilled", "truncated", distill=True),
        Row(f"untied {budget} blocks from scratch, uptraining steps, distilled", "scratch", distill=True),
        Row(f"untied {budget} blocks from scratch, teacher + uptraining steps, distilled", "scratch", all_tokens=True, distill=True),
        Row(f"teacher truncated to its first {budget} blocks, teacher + uptraining steps, distilled", "truncated", all_tokens=True, distill=True),
    ]
    if not smoke_test:
        return rows
    relaxed = next(row for row in rows if row.lora_rank and row.strategy == strategies[0])
    from_scratch = next(row for row in rows if row.start == "scratch" and not row.all_tokens)
    return [relaxed, from_scratch]


def _relaxed_row(strategy: str, rank: int, init: str, prefix: str = "", **family) -> Row:
    pattern = strategy.split(":")[-2]
    label = f"{prefix}converted, {pattern}, mean, relaxed r = {rank} ({init} init)"
    return Row(label, "teacher", strategy, tie_init="mean", lora_rank=rank, lora_init=init, **family)


def seed_dir(output: Path, seed: int) -> Path:
    """A seed's folder: its rows' folders and its teachers."""
    return output / f"seed{seed}"


def row_dir(output: Path, row: Row, seed: int) -> Path:
    """Where a row's run for a seed writes its log and `result.json`."""
    return seed_dir(output, seed) / row.directory


def teacher_ready(seed_folder: Path, model_type: str) -> bool:
    """Whether a seed's teacher of this family is there, its weights and its result (a fresh clone has the
    committed result alone: the teacher is trained again)."""
    teacher = seed_folder / TEACHER_DIRS[model_type]
    return all((teacher / name).is_file() for name in ("teacher_result.json", "model.safetensors"))
