"""What the study compares, on what, for how long: presets, command-line flags and the plan of runs.

A preset fixes every size (model, data, steps, seeds, memory runs); any of them can be overridden by its flag.
Every run of one study uses the same settings; the runs of one seed share initial weights and data order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from transformers import SchedulerType

from hf_layertie.language_modeling import HOP_TASKS

from .loop_study import (
    PREREGISTRATION,
    addendum_commit,
    preregistration_digest,
    read_preregistration,
    registration_commit,
    task_rows,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_PLAYS_DIR = REPO_ROOT / "bench" / "data" / "shakespeare"

# All 42 works, split by whole work (no line of an evaluation play is trained on). The seven plays the shipped
# tokenizers were trained on are training plays here too, so the tokenizer never saw an evaluation play.
SCHEDULES = tuple(schedule.value for schedule in SchedulerType)  # what `--lr_scheduler_type` accepts

STUDY_SPLITS: dict[str, tuple[str, ...]] = {
    "validation": ("macbeth", "tempest"),
    "test": ("hamlet", "lear", "othello", "much_ado_about_nothing"),
}


@dataclass(frozen=True)
class BenchSettings:
    """Everything that sizes one study. `num_threads=None` keeps torch's default."""

    n_layer: int
    n_embd: int
    n_head: int
    block_size: int
    max_steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    tying_interval: int
    max_distinct_blocks: int
    seeds: tuple[int, ...]
    max_test_blocks: int | None
    memory_depths: tuple[int, ...]
    memory_n_embd: int
    memory_n_head: int
    memory_max_distinct_blocks: int
    memory_batch_size: int
    memory_steps: int
    memory_tying_interval: int
    num_threads: int | None = 1
    use_gpu: bool = False
    # The paper's regime (preset `paper`): a small training corpus seen for many epochs, dropout, and the validation
    # and test loss measured every `eval_interval` steps, so that each run also reports the test loss of its
    # best-validation step (the paper's model selection). None: all training works, one evaluation at the end.
    train_works: tuple[str, ...] | None = None
    dropout: float = 0.0
    eval_interval: int | None = None
    max_validation_blocks: int | None = None
    controls: bool = False  # add `control_runs` to every seed
    # Stop a run once its validation loss has not fallen for this many evaluations in a row (transformers'
    # `EarlyStoppingCallback`; needs `eval_interval`): a run trains until it has passed its best-validation step and
    # then long enough to show what training on costs, not a fixed length that stops some runs before their minimum.
    # 0: every run trains all `max_steps`.
    early_stopping_patience: int = 0
    # A generated task instead of the plays (preset `depth`): `<name>:<config>` of `hf_layertie.language_modeling.
    # generated_tasks.HOP_TASKS`, e.g. "hop_induction:length=64,max_hops=4"; every run then also reports accuracy per hop
    # count, and the static layouts are also trained at the budget itself (`<layout> @ U`), not only at DLT's.
    task: str | None = None
    # Issue 53's partial loops instead of the study's strategies (preset `partial`, `partial_loop_runs`): U untied
    # blocks against the same U blocks looped over more positions. No agent, no memory runs.
    partial_loops: bool = False
    # The training recipe (issue 53, part 2): transformers' `lr_scheduler_type` and AdamW's decoupled `weight_decay`.
    # The study's are cosine and 0.1; bench/hop_probe.py's plain loop, which trained looped models reliably on
    # k-hop induction where the study's recipe lost tied seeds, has linear decay and 0.01.
    lr_scheduler_type: str = "cosine"
    weight_decay: float = 0.1
    # Every this many optimizer steps, each distinct block's gradient norm and the rest's (bench/gradient_norms.py),
    # and the Trainer's log (loss, gradient norm before clipping, learning rate) at the same steps. None: neither.
    gradient_norm_interval: int | None = None
    # Issue 53, part 2's rows instead of the study's strategies (preset `recipe`, `recipe_runs`): the untied and
    # looped models whose reliability a recipe is chosen for. No agent, no memory runs.
    recipe_rows: bool = False
    # With `recipe_rows`, DLT and random tying at the budget as well, without their followers (final maps from
    # scratch, layouts at their final U): the equal-memory comparison that the recipe chosen on seeds 0-4 is frozen
    # for and run on fresh seeds (issue 53, part 2).
    recipe_agents: bool = False
    # Train under the recipe bench/recipe_report.py chose on seeds 0-4 (`RECIPE_REPORT`), frozen when the results
    # folder is claimed (`freeze_recipe`), instead of the schedule and weight decay above: the presets run after the
    # choice (`depth-fresh`, `partial-depth`).
    frozen_recipe: bool = False
    # Issue 76: one task of the pre-registered study of the loop recipe (presets `loops-*`): its key among the tasks of
    # bench/preregistration/looped-models.json, which fixes the task, the seeds and the rows (`loop_study_runs`).
    # `preregistration_digest` is the digest of what the file fixes for that task when the settings were resolved
    # (`preregistered`): a results folder claimed under one registration of its task refuses runs of another.
    loop_study: str | None = None
    preregistration_digest: str | None = None
    # An addendum to that pre-registration a preset's runs answer to, a file of bench/preregistration/ (preset
    # loops-language-steps: looped-language-compute.json). Each record names the commit holding it as it is
    # (`preregistration_commit`), and no run starts under it uncommitted or edited (loop_study.addendum_commit).
    addendum: str | None = None
    # The seed `--tune_learning_rates` trains its grid on. None: the first of `seeds`, whose runs at the chosen rates
    # then count in the study too (default, paper: each row's seed-0 run there is the best of its grid on validation
    # loss). A seed outside `seeds` keeps every seed the study reports out of the choice (partial).
    tuning_seed: int | None = None
    # Whether the memory runs train with gradient checkpointing (transformers' `gradient_checkpointing`): each value
    # listed is a set of memory runs of its own, so that the report sets the two side by side. Tying cuts the training
    # state, not the activations, which checkpointing cuts. Like `seeds`, it says which runs to make, not how a run
    # is measured (a checkpointed run has a folder and a record of its own): a folder's runs keep their fingerprint.
    memory_gradient_checkpointing: tuple[bool, ...] = (False, True)
    # Fork each run but the memory runs from a process that has imported the libraries once (bench/scheduling.py's
    # forked runs): about 5 s of one core less per run, which matters only for runs of seconds (preset tiny).
    fork_runs: bool = False

    def fingerprint(self) -> str:
        """What a result must have been measured under to be reused (everything but scheduling)."""
        return fingerprint(self, scheduling=SCHEDULING_SETTINGS)

    def registration_commit(self) -> str | None:
        """The commit holding the registration these runs answer to (the study's task, or an addendum), which each
        record names; None for a preset that answers to none. An uncommitted or edited registration raises."""
        if self.loop_study is not None:
            return registration_commit(self.loop_study, self.preregistration_digest)
        if self.addendum is not None:
            return addendum_commit(PREREGISTRATION.parent / self.addendum)
        return None


# Settings that choose which runs to make, or how fast they go, not what a run measures: out of the fingerprint.
SCHEDULING_SETTINGS = ("seeds", "tuning_seed", "num_threads", "memory_gradient_checkpointing", "fork_runs")


# Settings added after runs were recorded, with the value that behaves as before: left out of a fingerprint at that
# value, so that the earlier runs keep theirs.
LATER_SETTINGS = {
    "task": None, "early_stopping_patience": 0, "partial_loops": False, "lr_scheduler_type": "cosine",
    "weight_decay": 0.1, "gradient_norm_interval": None, "recipe_rows": False, "recipe_agents": False,
    "frozen_recipe": False, "loop_study": None, "preregistration_digest": None, "addendum": None,
}  # fmt: skip


def fingerprint(settings, scheduling: tuple[str, ...], later: dict | None = None) -> str:
    """A settings dataclass as JSON without its `scheduling` fields, and without a field of `later` (by default
    `LATER_SETTINGS`) at its former behaviour."""
    fields = {name: value for name, value in dataclasses.asdict(settings).items() if name not in scheduling}
    for name, former in (LATER_SETTINGS if later is None else later).items():
        if name in fields and fields[name] == former:
            del fields[name]
    return json.dumps(fields)


def check_task(task: str | None) -> None:
    """`--task` names a generated task: `<name>:<config>` with a name of `HOP_TASKS`."""
    if task is not None and task.partition(":")[0] not in HOP_TASKS:
        raise ValueError(f"--task {task!r}: expected '<name>:<config>' with a name among {', '.join(sorted(HOP_TASKS))}")


PRESETS_DIR = REPO_ROOT / "bench" / "presets"


def preset_files(folder: Path) -> dict[str, dict]:
    """One tool's presets as written: a JSON file per preset in `folder`, named after it, holding `help` (one line for
    `--help`), `why` (what the preset is for and why it is sized so), `settings` (the fields it sets) and, for a
    preset derived from another, `base` (that preset's name: its settings are the starting point)."""
    files = sorted(folder.glob("*.json"), key=lambda path: path.stem)
    if not files:
        raise FileNotFoundError(f"{folder}: no preset files (<name>.json) there")
    return {path.stem: json.loads(path.read_text()) for path in files}


def read_presets(folder: Path, settings_class: type) -> dict:
    """`settings_class` instances of the presets in `folder` (`preset_files`), each base resolved first; JSON lists
    become the tuples the settings hold. A file naming an unknown field or base fails with one error naming it."""
    documents, presets = preset_files(folder), {}

    def resolve(name: str, derived: tuple[str, ...] = ()) -> object:
        if name not in presets:
            if name not in documents or name in derived:
                raise ValueError(f"{folder / derived[-1]}.json: base {name!r} is not a preset of {folder} it can start from")
            document = documents[name]
            fields = {key: tuple(value) if isinstance(value, list) else value for key, value in document["settings"].items()}
            base = document.get("base")
            try:
                presets[name] = dataclasses.replace(resolve(base, (*derived, name)), **fields) if base else settings_class(**fields)
            except TypeError as error:
                raise ValueError(f"{folder / name}.json: {error}") from None
        return presets[name]

    return {name: resolve(name) for name in documents}


def presets_help(folder: Path) -> str:
    """The `--preset` help: each preset's name and its `help` line, then where the files are."""
    lines = " ".join(f"{name}: {document['help']}" for name, document in preset_files(folder).items())
    return f"{lines} ({folder.relative_to(REPO_ROOT)}/<preset>.json)"


# The study's presets (bench/presets/study): each fixes every size (model, data, steps, seeds, memory runs).
PRESETS: dict[str, BenchSettings] = read_presets(PRESETS_DIR / "study", BenchSettings)
RECIPE_REPORT = REPO_ROOT / "bench" / "reports" / "study" / "recipe" / "results.json"
RECIPE_FIELDS = ("lr_scheduler_type", "weight_decay")


def freeze_recipe(settings: BenchSettings, args: BenchArguments, output: Path) -> BenchSettings:
    """A `frozen_recipe` preset's settings under its frozen recipe: the one its results folder was claimed under
    (every run of the folder, a scheduler's child runs and `--report_only` too, so that a later choice cannot change
    them), or for a new folder the one `RECIPE_REPORT` chose, refused while that choice is provisional, so that no
    fresh seed trains before the recipe is frozen. Recipe flags are refused: the recipe is not chosen here."""
    if not settings.frozen_recipe:
        return settings
    given = [f"--{name}" for name in RECIPE_FIELDS if getattr(args, name) is not None]
    if given:
        raise ValueError(
            f"{' and '.join(given)}: preset {args.preset} trains under the recipe chosen on seeds 0-4 ({RECIPE_REPORT}), "
            "frozen in its results folder; it takes no recipe flags"
        )
    claimed = output / "settings.json"
    recipe = folder_recipe(output) if claimed.is_file() else chosen_recipe(RECIPE_REPORT)
    return dataclasses.replace(settings, **recipe)


def folder_settings(folder: Path) -> dict:
    """The settings a results folder's runs were measured under: its settings.json's fingerprint, as a dict (a
    `LATER_SETTINGS` field at its former value is left out)."""
    return json.loads(json.loads((folder / "settings.json").read_text())["fingerprint"])


class Fingerprinted(Protocol):
    """Settings whose `fingerprint()` says what a run measures (BenchSettings, CompressSettings)."""

    def fingerprint(self) -> str: ...


def measured_under(folder: Path, settings: Fingerprinted) -> bool:
    """Whether a results folder's runs were measured under `settings`: its settings.json holds their fingerprint
    (False where the folder has no settings.json). Each caller says in its own error what a mismatch means there."""
    settings_file = folder / "settings.json"
    return settings_file.is_file() and json.loads(settings_file.read_text())["fingerprint"] == settings.fingerprint()


def folder_recipe(folder: Path) -> dict[str, str | float]:
    """The schedule and weight decay a results folder's runs were measured under, from its settings.json (a study
    value is left out of the fingerprint, so it is LATER_SETTINGS')."""
    fields = folder_settings(folder)
    return {name: fields.get(name, LATER_SETTINGS[name]) for name in RECIPE_FIELDS}


def chosen_recipe(report: Path) -> dict[str, str | float]:
    """The schedule and weight decay of the recipe chosen in `report` (bench/recipe_report.py's results.json), or one
    error saying why there is none to freeze yet."""
    try:
        payload = json.loads(report.read_text())
        choice, recipes = payload["choice"], payload["recipes"]
        complete, pairs = choice["complete"], choice["pairs"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{report}: no recipe choice to freeze there ({error!r}); run bench/recipe_report.py") from None
    if not complete:
        raise ValueError(
            f"the recipe choice in {report} is provisional: {pairs} (row, seed) pairs have finished under every "
            "recipe, not all. Finish the recipe grid (preset recipe) and rerun bench/recipe_report.py first."
        )
    recipe = recipes[choice["recipe"]]
    return {name: recipe[name] for name in RECIPE_FIELDS}


def _override(help_text: str) -> dict:
    return field(default=None, metadata={"help": f"{help_text} None = the preset's value."})


@dataclass
class BenchArguments:
    """Flags of `bench/run_bench.py`. Size flags left unset take the preset's value."""

    preset: Literal[tuple(PRESETS)] = field(
        default="default", metadata={"help": presets_help(PRESETS_DIR / "study")}
    )
    results_dir: str | None = field(
        default=None, metadata={"help": "Where the runs' records go (one folder per run). Default: bench/results/<preset>."}
    )
    report_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where results.json, results.md and the plots go. Default: bench/reports/study/<preset>, the committed "
            "report, for a preset's own runs; the results folder for tiny or another --results_dir."
        },
    )
    jobs: int = field(default=1, metadata={"help": "Runs side by side, each a single-threaded process (CPU)."})
    report_only: bool = field(default=False, metadata={"help": "Write the report from finished runs; train nothing."})
    skip_memory: bool = field(default=False, metadata={"help": "Leave out the memory runs over depth."})
    tune_learning_rates: str | None = field(
        default=None,
        metadata={
            "help": "Comma-separated learning rates, e.g. '1e-3,3e-3,1e-2': train every strategy of the tuning seed "
            "(--tuning_seed) at each, write learning_rates.json (each strategy's rate with the lowest validation loss) and "
            "stop; a later run of the study trains each strategy at its chosen rate (the tuning seed's runs are reused "
            "when it is one of the seeds). With "
            "--report_only, write learning_rates.json from the runs finished so far."
        },
    )
    tuned_learning_rates: bool = field(
        default=True,
        metadata={
            "help": "Train and report each strategy at the rate --tune_learning_rates chose (learning_rates.json in the "
            "results folder, where it exists). false: every strategy at the preset's rate, e.g. to regenerate a report "
            "made before the tuning."
        },
    )
    learning_rates_from: str | None = field(
        default=None,
        metadata={
            "help": "A results folder whose learning_rates.json gives each strategy's rate, e.g. the grid of a study "
            "of the same models at another length. Default: the results folder's own."
        },
    )
    rows: str | None = field(
        default=None,
        metadata={
            "help": "Only these rows of the plan, their labels separated by '|', e.g. 'cycle @ U|untied, 2 blocks' (the "
            "rows bench/recipe_report.py chooses on); with --tune_learning_rates, only their grids are trained (the "
            "learning rates are chosen from every row's finished grid). Neither the runs "
            "that follow a finished DLT, random or similarity run nor the memory runs are queued. Default: every row."
        },
    )
    memory_only: bool = field(
        default=False,
        metadata={
            "help": "Only the memory runs, e.g. where the training state dominates the process: --memory_only "
            "--memory_depths 48 --memory_n_embd 512 --memory_n_head 8."
        },
    )
    n_layer: int | None = _override("Blocks of the compared models.")
    n_embd: int | None = _override("Hidden size of the compared models.")
    n_head: int | None = _override("Attention heads of the compared models.")
    block_size: int | None = _override("Tokens per example (also the models' context).")
    max_steps: int | None = _override("Optimizer steps of every run.")
    batch_size: int | None = _override("Examples per optimizer step.")
    learning_rate: float | None = _override("Peak learning rate (AdamW, cosine decay).")
    warmup_steps: int | None = _override("Linear warm-up steps.")
    tying_interval: int | None = _override("k: optimizer steps between two decisions.")
    max_distinct_blocks: int | None = _override("The budget U: distinct blocks dlt, random and similarity may use.")
    seeds: str | None = _override("Comma-separated seeds, e.g. '0,1,2'; each seed is one paired replicate.")
    tuning_seed: int | None = _override(
        "The seed --tune_learning_rates trains on; unset in the preset, the first of the seeds (whose runs then count)."
    )
    max_test_blocks: int | None = _override("Cap on the test blocks evaluated.")
    memory_depths: str | None = _override("Comma-separated depths of the memory runs, e.g. '12,24,48'.")
    memory_n_embd: int | None = _override("Hidden size of the memory runs.")
    memory_n_head: int | None = _override("Attention heads of the memory runs.")
    memory_max_distinct_blocks: int | None = _override("Budget of the DLT memory runs.")
    memory_batch_size: int | None = _override("Examples per step in the memory runs.")
    memory_steps: int | None = _override("Optimizer steps per memory run.")
    memory_tying_interval: int | None = _override("k of the DLT memory runs.")
    memory_gradient_checkpointing: str | None = _override(
        "Comma-separated: the memory runs without ('false') and with ('true') transformers' gradient checkpointing, each "
        "value its own runs; default 'false,true', both side by side."
    )
    dropout: float | None = _override("Dropout of the compared models (residual, embedding, attention).")
    lr_scheduler_type: str | None = _override("transformers' learning-rate schedule after warm-up, e.g. 'cosine', 'linear'.")
    weight_decay: float | None = _override("AdamW's decoupled weight decay.")
    gradient_norm_interval: int | None = _override(
        "Record each distinct block's gradient norm, and the training log, every this many optimizer steps."
    )
    eval_interval: int | None = _override("Steps between two measurements of the validation and test loss.")
    max_validation_blocks: int | None = _override("Cap on the validation blocks evaluated.")
    early_stopping_patience: int | None = _override(
        "Stop a run after this many evaluations without a lower validation loss; 0: train every step."
    )
    task: str | None = _override("A generated task instead of the plays, e.g. 'hop_induction:length=16,max_hops=2'.")
    num_threads: int | None = _override("torch intra-op threads per run.")
    use_gpu: bool | None = _override("'true': train on the CUDA GPU (preset gpu does).")
    single_run: str | None = field(
        default=None, metadata={"help": "Internal: the JSON run spec this process trains and measures."}
    )

    def __post_init__(self):
        if self.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.jobs}")
        if self.memory_only and (self.rows is not None or self.skip_memory):
            given = "--rows" if self.rows is not None else "--skip_memory"
            raise ValueError(f"--memory_only with {given}: the first trains only the memory runs, which the second leaves out")
        if self.learning_rates_from is not None and not self.tuned_learning_rates:
            raise ValueError(
                f"--learning_rates_from {self.learning_rates_from} with --tuned_learning_rates false: the second trains "
                "every strategy at the preset's rate, so the first would be ignored"
            )
        if self.tune_learning_rates is not None:
            parse_learning_rates(self.tune_learning_rates)  # a bad grid is refused before the folder is claimed


def grid_seed(settings: BenchSettings) -> int:
    """The seed `--tune_learning_rates` trains its grid on (`tuning_seed`)."""
    return settings.seeds[0] if settings.tuning_seed is None else settings.tuning_seed


def resolve_settings(args: BenchArguments) -> BenchSettings:
    """The preset with every flag the user set applied on top, checked."""
    overrides = {
        setting.name: getattr(args, setting.name)
        for setting in dataclasses.fields(BenchSettings)
        if getattr(args, setting.name, None) is not None
    }
    for name, parse in LIST_FLAGS.items():
        if name in overrides:
            overrides[name] = parse(overrides[name], name)
    settings = dataclasses.replace(PRESETS[args.preset], **overrides)
    settings = preregistered(settings, given=tuple(overrides), own_folder=args.results_dir is not None)
    _check(settings)
    return settings


def preregistered(settings: BenchSettings, given: tuple[str, ...] = (), own_folder: bool = False) -> BenchSettings:
    """A `loop_study` preset's settings with the pre-registration's task, depth, budget and seeds and the digest of
    what it fixes for the task; the rest is the preset's, as registered. `given`: the settings the user set by flag,
    of which only the scheduling ones (`SCHEDULING_SETTINGS`) are taken, and seeds outside the registered ones only
    into a folder of their own (`own_folder`, --results_dir), so that nothing unregistered enters the study."""
    if settings.loop_study is None:
        return settings
    refused = [f"--{name}" for name in given if name not in SCHEDULING_SETTINGS]
    if refused:
        raise ValueError(
            f"{', '.join(refused)}: a loops preset trains as {PREREGISTRATION} registered it (its task, depth and budget "
            f"from the file, the rest from the preset); it takes only {', '.join(f'--{name}' for name in SCHEDULING_SETTINGS if name != 'fork_runs')}"
        )
    registration = read_preregistration()
    plan = registration["tasks"].get(settings.loop_study)
    if plan is None:
        raise ValueError(f"{PREREGISTRATION}: no task {settings.loop_study!r}; its tasks: {', '.join(registration['tasks'])}")
    registered = tuple(registration["seeds"])
    seeds = settings.seeds or registered
    if not own_folder and not set(seeds) <= set(registered):
        unregistered = ", ".join(map(str, sorted(set(seeds) - set(registered))))
        raise ValueError(f"--seeds: {unregistered} not registered ({PREREGISTRATION}); such seeds train only into a folder of their own (--results_dir)")
    task = plan["task"]
    block_size = settings.block_size if task is None else task_sequence_length(task)
    return dataclasses.replace(
        settings, task=task, n_layer=plan["depth"], max_distinct_blocks=plan["budget"], block_size=block_size,
        seeds=seeds, preregistration_digest=preregistration_digest(settings.loop_study),
    )  # fmt: skip


def task_sequence_length(task: str) -> int:
    """Tokens per example of a generated task, `<name>:<config>`: the context its models need."""
    name, _, config = task.partition(":")
    return HOP_TASKS[name].config_class.from_string(config).sequence_length


def parse_learning_rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        rates = ()
    if not rates or not all(0 < rate < 1 for rate in rates):
        raise ValueError(f"--tune_learning_rates {text!r}: expected comma-separated learning rates in (0, 1), e.g. '1e-3,3e-3,1e-2'")
    return rates


def with_preset_seeds(settings, preset):
    """`settings` (a study's or compress's) over its preset's seeds and those it was given: a lane given `--seeds`
    must not shrink the folder's report to its own seeds."""
    return dataclasses.replace(settings, seeds=tuple(sorted({*preset.seeds, *settings.seeds})))


def parse_integers(text: str, name: str) -> tuple[int, ...]:
    """`--<name>`'s comma-separated non-negative integers (seeds, depths), or one error naming the flag."""
    parts = _parts(text)
    if not parts or not all(part.isdecimal() for part in parts):
        raise ValueError(f"--{name} {text!r}: expected comma-separated non-negative integers, e.g. '0,1,2'")
    return tuple(int(part) for part in parts)


def parse_booleans(text: str, name: str) -> tuple[bool, ...]:
    """`--<name>`'s comma-separated 'false' / 'true', each once, or one error naming the flag."""
    parts = [part.lower() for part in _parts(text)]
    if not parts or not set(parts) <= {"false", "true"} or len(set(parts)) < len(parts):
        raise ValueError(f"--{name} {text!r}: expected 'false', 'true' or 'false,true'")
    return tuple(part == "true" for part in parts)


def _parts(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


# The settings a flag gives as a comma-separated list, and how each is read.
LIST_FLAGS = {"seeds": parse_integers, "memory_depths": parse_integers, "memory_gradient_checkpointing": parse_booleans}


def _check(settings: BenchSettings) -> None:
    positive = (
        "n_layer", "n_embd", "n_head", "block_size", "max_steps", "batch_size", "tying_interval", "max_distinct_blocks",
        "memory_n_embd", "memory_n_head", "memory_max_distinct_blocks", "memory_batch_size", "memory_steps",
        "memory_tying_interval",
    )  # fmt: skip
    for name in positive:
        if getattr(settings, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(settings, name)}")
    for name in ("max_test_blocks", "num_threads", "eval_interval", "max_validation_blocks", "gradient_norm_interval"):
        value = getattr(settings, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    check_task(settings.task)
    if settings.addendum is not None and not (PREREGISTRATION.parent / settings.addendum).is_file():
        raise ValueError(f"the preset's addendum {settings.addendum!r}: no such file in {PREREGISTRATION.parent}")
    if settings.addendum is not None and settings.loop_study is not None:  # a record names one registration's commit
        raise ValueError(f"a preset answers to the study ({settings.loop_study!r}) or to an addendum ({settings.addendum!r}), not both")
    if settings.partial_loops:
        partial_loop_runs(settings, 0)  # a budget with no such loops fails here
    if settings.early_stopping_patience < 0:
        raise ValueError(f"--early_stopping_patience must be >= 0, got {settings.early_stopping_patience}")
    if settings.early_stopping_patience and not settings.eval_interval:
        raise ValueError("--early_stopping_patience needs --eval_interval: it counts evaluations of the validation loss")
    if settings.lr_scheduler_type not in SCHEDULES:
        raise ValueError(f"--lr_scheduler_type {settings.lr_scheduler_type!r}: expected one of {', '.join(SCHEDULES)}")
    if settings.weight_decay < 0:
        raise ValueError(f"--weight_decay must be >= 0, got {settings.weight_decay}")
    if not 0 <= settings.dropout < 1:
        raise ValueError(f"--dropout must be in [0, 1), got {settings.dropout}")
    if settings.learning_rate <= 0:
        raise ValueError(f"--learning_rate must be > 0, got {settings.learning_rate}")
    if settings.max_distinct_blocks >= settings.n_layer:
        raise ValueError(
            f"--max_distinct_blocks {settings.max_distinct_blocks} must be below --n_layer {settings.n_layer}: "
            "the study compares ways of sharing blocks under a budget"
        )
    if min(settings.memory_depths) <= settings.memory_max_distinct_blocks:
        raise ValueError(
            f"--memory_depths {settings.memory_depths}: every depth must exceed --memory_max_distinct_blocks "
            f"{settings.memory_max_distinct_blocks}"
        )
    for size, heads, prefix in ((settings.n_embd, settings.n_head, ""), (settings.memory_n_embd, settings.memory_n_head, "memory_")):
        if size % heads:
            raise ValueError(f"--{prefix}n_embd {size} must be divisible by --{prefix}n_head {heads}")


def results_dir(args: BenchArguments) -> Path:
    return Path(args.results_dir) if args.results_dir is not None else REPO_ROOT / "bench" / "results" / args.preset


def report_dir(args: BenchArguments) -> Path:
    """bench/reports/study/<preset> for a preset's own runs (what the README and bench/README read); beside the runs
    for tiny or another results folder, so that an experiment never overwrites a committed report."""
    if args.report_dir is not None:
        return Path(args.report_dir)
    if args.preset == "tiny" or args.results_dir is not None:
        return results_dir(args)
    return REPO_ROOT / "bench" / "reports" / "study" / args.preset


# ----- the plan: which runs, in which order -----


@dataclass(frozen=True)
class RunSpec:
    """One training run: `label` is its row in the table, `strategy` what TyingTrainer gets (same strategy, same
    run: two labels may share one), `kind` "study" or "memory"."""

    label: str
    strategy: str
    seed: int
    kind: str = "study"
    dlt_variant: str = "default"
    num_blocks: int | None = None
    tying: tuple[tuple[str, object], ...] = ()  # other tying settings, (name, value) pairs: the controls' changes
    looped_config: tuple[tuple[str, object], ...] = ()  # the model's loop recipe / skipped positions, (name, value) pairs
    learning_rate: float | None = None  # None: the preset's; else this run's (chosen per label by --tune_learning_rates)
    rate_of: str | None = None  # the label whose chosen learning rate this run takes; None: its own
    gradient_checkpointing: bool = False  # transformers' gradient checkpointing (memory runs: `memory_gradient_checkpointing`)

    @property
    def directory(self) -> str:
        """`<kind>/[L<blocks>/]<strategy>[-<variant>][-<setting>=<value>...][-lr<rate>][-checkpointing]/seed<N>`: a run
        recorded before a part existed keeps its folder, as that part is absent at its former value."""
        name = self.strategy.replace(":", "-").replace(",", "_")
        if self.dlt_variant != "default":
            name += f"-{self.dlt_variant}"
        name += "".join(f"-{setting}={value}" for setting, value in (*self.tying, *self.looped_config))
        if self.learning_rate is not None:
            name += f"-lr{self.learning_rate:g}"
        if self.gradient_checkpointing:
            name += "-checkpointing"
        depth = f"L{self.num_blocks}/" if self.num_blocks is not None else ""
        return f"{self.kind}/{depth}{name}/seed{self.seed}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        fields = json.loads(text)
        for name in ("tying", "looped_config"):
            fields[name] = tuple(tuple(pair) for pair in fields.get(name, ()))
        return cls(**fields)


STATIC_LAYOUTS = ("sequence", "cycle", "cycle_rev")
FINAL_MAP_LABEL = "dlt final map, from scratch"
RANDOM_FINAL_MAP_LABEL = "random final map, from scratch"
SIMILARITY_FINAL_MAP_LABEL = "similarity final map, from scratch"


def untied_label(settings: BenchSettings) -> str:
    return f"untied, {settings.max_distinct_blocks} blocks"


def independent_runs(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """The runs of a seed that need nothing from another run, tier by tier."""
    return [spec for runs_of in run_tiers(settings) for spec in runs_of(settings, seed)]


def run_tiers(settings: BenchSettings) -> list[Callable[[BenchSettings, int], list[RunSpec]]]:
    """The plan's tiers, in the order a study runs them (every seed's runs of one tier before the next tier's): the
    equal-memory runs, the other strategies, the controls (presets with `controls`). A long preset stopped early
    then has its first question's contrasts over the most seeds. Preset `partial`: its loops alone; `recipe`: its
    rows alone; `depth-fresh`: those rows, then DLT and random."""
    if settings.partial_loops:
        return [partial_loop_runs]
    if settings.loop_study is not None:
        return [functools.partial(loop_study_runs, tier=tier) for tier in LOOP_STUDY_TIERS]
    if settings.recipe_rows:
        return [recipe_runs] + ([agent_runs_at_budget] if settings.recipe_agents else [])
    return [equal_memory_runs, other_strategy_runs] + ([control_runs] if settings.controls else [])


def row_labels(text: str) -> list[str]:
    """The labels of a `--rows` flag (run_bench.py, rerun_check.py): separated by '|', the spaces around each
    ignored, in the order given, each once."""
    return list(dict.fromkeys(label.strip() for label in text.split("|")))


def parse_rows(text: str | None, settings: BenchSettings) -> frozenset[str] | None:
    """`--rows`' labels, each one a row of the plan (its first seed's), or None for every row."""
    if text is None:
        return None
    rows = frozenset(row_labels(text))
    planned = {spec.label for runs_of in run_tiers(settings) for spec in runs_of(settings, settings.seeds[0])}
    unknown = sorted(rows - planned)
    if unknown:
        raise SystemExit(f"--rows: {', '.join(map(repr, unknown))} is not a row of this plan; its rows: {' | '.join(sorted(planned))}")
    return rows


def core_runs(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """The runs behind the study's main contrasts (what --tune_learning_rates tunes): every tier but the controls."""
    return [spec for runs_of in run_tiers(settings) if runs_of is not control_runs for spec in runs_of(settings, seed)]


def equal_memory_runs(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """What the study's first question needs (what to train at the memory of U blocks): conventional training at
    full depth, `untied, U blocks` (conventional training of a model as shallow as the budget: the same parameters,
    gradients and optimizer state as a tied model with U distinct blocks, so the alternative a user with that memory
    would pick instead of tying) and DLT, whose finished run queues the fixed layouts at its budget. With a task,
    the fixed layouts at the budget too (the looped models of the looped-transformer literature are `cycle @ U`)."""
    budget = settings.max_distinct_blocks
    layouts = layouts_at_budget(settings, seed) if settings.task is not None else []
    return [
        RunSpec("none", "none", seed),
        RunSpec(untied_label(settings), "none", seed, num_blocks=budget),
        *layouts,
        dlt_run(seed),
    ]


def layouts_at_budget(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """Each fixed layout of `STATIC_LAYOUTS` at the budget itself (`<layout> @ U`)."""
    return [RunSpec(f"{layout} @ U", f"static:{layout}:{settings.max_distinct_blocks}", seed) for layout in STATIC_LAYOUTS]


def other_strategy_runs(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """The other ways of choosing a map under the budget: the paper's agent, random tying, similarity."""
    return [
        paper_agent_run(seed),
        RunSpec("random", "random", seed),
        RunSpec("similarity", f"similarity:{settings.max_distinct_blocks}", seed),
    ]


# Issue 53, part 1. The looped models of parameter golf's best records apply a few mid-stack layers twice (11 layers
# at 13 positions); looping everything cost them. So: U blocks over U+1, U+2 and 2U positions, a loop of consecutive
# blocks applied again right after itself, against U untied blocks (the same parameters, gradients and optimizer
# state, less compute) and against the same loop at the start and at the end of the stack. The loop is as wide as
# the extra positions, at most the U-2 blocks of the middle: at U+1 one block runs twice; at U+2 two blocks run twice
# (U = 4), or one block three times (U = 3); at 2U the whole middle, every block but the first and the last, runs
# 1 + U/(U-2) times (3 times at U = 4, 4 times at U = 3). Canonical maps (each position names the
# first position with its weights), at U = 4:
#   5 positions: middle 0 1 1 3 4 (the lower of the two middle blocks), start 0 0 2 3 4, end 0 1 2 3 3
#   6 positions: middle 0 1 2 1 2 5, start 0 1 0 1 4 5, end 0 1 2 3 2 3
#   8 positions: middle 0 1 2 1 2 1 2 7, start 0 1 0 1 0 1 6 7, end 0 1 2 3 2 3 2 3
LOOP_PLACES = ("middle", "start", "end")


def loop_map(distinct: int, positions: int, place: str) -> list[int]:
    """The canonical map of `distinct` blocks over `positions` with the loop at `place` (the comment above)."""
    extra = positions - distinct
    width = extra if extra <= distinct - 2 else distinct - 2  # 2U: the whole middle
    if not 0 < extra <= distinct or width < 1 or extra % width:
        raise ValueError(
            f"no loop of {distinct} blocks over {positions} positions: U+1 and U+2 positions need U >= 3, and 2U needs "
            "the middle's U-2 blocks to loop a whole number of times (U = 3 or 4)"
        )
    first = {"start": 0, "middle": (distinct - width) // 2, "end": distinct - width}[place]
    blocks = [*range(first + width), *list(range(first, first + width)) * (extra // width), *range(first + width, distinct)]
    return [blocks.index(block) for block in blocks]


def loop_label(distinct: int, positions: int, place: str) -> str:
    return f"loop {place}, {positions} positions ({' '.join(map(str, loop_map(distinct, positions, place)))})"


def loop_positions(settings: BenchSettings) -> tuple[int, ...]:
    budget = settings.max_distinct_blocks
    return tuple(sorted({budget + 1, budget + 2, 2 * budget}))


def partial_loop_runs(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """`untied, U blocks`, then at each number of positions the loop in the middle, at the start and at the end."""
    budget = settings.max_distinct_blocks
    loops = [
        RunSpec(loop_label(budget, positions, place), "static:" + ",".join(map(str, loop_map(budget, positions, place))), seed, num_blocks=positions)
        for positions in loop_positions(settings)
        for place in LOOP_PLACES
    ]
    return [RunSpec(untied_label(settings), "none", seed, num_blocks=budget), *loops]


# Issue 53, part 2: the rows a recipe must train reliably. On k-hop induction with the study's recipe (preset
# `depth`), the looped layouts at 2 of 4 blocks lost 2 of 5 seeds each, while similarity's map `0 1 1 1` trained
# from scratch lost one; the plain loop of bench/hop_probe.py trained the looped model on every seed. The
# looped model comes first: its failing seeds are what the gradient norms are recorded for.
RECIPE_FIRST = "cycle @ U"


def recipe_runs(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """`cycle @ U`, the untied models at the budget and at full depth, the other layouts at U and `0 1 1 1`."""
    layouts = layouts_at_budget(settings, seed)
    first = next(spec for spec in layouts if spec.label == RECIPE_FIRST)
    similarity_map = [0] + [1] * (settings.n_layer - 1)
    return [
        first,
        RunSpec(untied_label(settings), "none", seed, num_blocks=settings.max_distinct_blocks),
        RunSpec("none", "none", seed),
        *(spec for spec in layouts if spec is not first),
        RunSpec(" ".join(map(str, similarity_map)), "static:" + ",".join(map(str, similarity_map)), seed),
    ]


LOOP_STUDY_TIERS = (1, 2, 3)  # bench/loop_study.py: the main rows, each part of the recipe alone, onset and DLT


def loop_study_runs(settings: BenchSettings, seed: int, tier: int | None = None) -> list[RunSpec]:
    """The pre-registered rows of the preset's task (bench/loop_study.py), those of `tier` or all of them."""
    return [
        RunSpec(row.label, row.strategy, seed, num_blocks=row.num_blocks, tying=row.tying, looped_config=row.looped_config)
        for row in task_rows(read_preregistration(), settings.loop_study)
        if tier is None or row.tier == tier
    ]


def agent_runs_at_budget(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """DLT and random tying capped at the budget, beside the recipe rows."""
    return [dlt_run(seed), RunSpec("random", "random", seed)]


def plan_contrasts(settings: BenchSettings) -> dict[str, dict[str, str]]:
    """The rows a plan pairs beyond the study's baselines: label -> {name: other label}. `partial`: each loop in the
    middle against the same loop at the start and at the end."""
    if settings.loop_study is not None:
        return {row.label: dict(row.versus) for row in task_rows(read_preregistration(), settings.loop_study) if row.versus}
    if not settings.partial_loops:
        return {}
    budget = settings.max_distinct_blocks
    return {
        loop_label(budget, positions, "middle"): {f"loop at {place}": loop_label(budget, positions, place) for place in ("start", "end")}
        for positions in loop_positions(settings)
    }


# The exploration share of the two exploration controls (`dlt, exploration 20%` and the same, then commit). It is of
# the planned decisions, and an early-stopped run never reaches its plan: in `paper` DLT's best-validation steps are
# 1,600-2,300 of 6,000 planned, so the default 80% would end exploration at step 4,800 (after every run has stopped:
# committing then changes nothing) and 40% at 2,400 (after every best step). 20% ends it at step 1,200 there, and at
# step 400 of 2,000 in `default`, so that the committed map trains long enough to be what a run selects.
CONTROL_EXPLORATION_FRACTION = 0.2


def control_runs(settings: BenchSettings, seed: int) -> list[RunSpec]:
    """What the verdict on DLT must not hinge on: a shorter exploration, and the same then committed to (no decision
    once exploration ends: does moving between maps cost?), the paper's agent learning from a reward that carries
    signal at these losses (its own is -10 whenever the loss is above ln 10), and other decision intervals k. Each
    changes settings of its strategy (the commit control one setting of the shorter exploration) and trains at that
    strategy's learning rate (`rate_of`), so that the contrast changes those settings alone: --tune_learning_rates
    tunes the strategies, not their controls."""
    dlt, paper_agent = dlt_run(seed), paper_agent_run(seed)
    intervals = [k for k in (2, 15, 50) if k != settings.tying_interval]
    shorter = _control(dlt, f"dlt, exploration {CONTROL_EXPLORATION_FRACTION:.0%}", exploration_fraction=CONTROL_EXPLORATION_FRACTION)
    return [
        shorter,
        _control(dlt, f"{shorter.label}, then commit", **dict(shorter.tying), commit_after_exploration=True),
        _control(paper_agent, "dlt (paper agent), reward -loss", reward_kind="negative_loss"),
        *(_control(dlt, f"dlt, k = {k}", tying_interval=k) for k in intervals),
    ]


def _control(strategy: RunSpec, label: str, **settings: object) -> RunSpec:
    return dataclasses.replace(strategy, label=label, tying=tuple(settings.items()), rate_of=strategy.label)


def dlt_run(seed: int) -> RunSpec:
    return RunSpec("dlt", "dlt", seed)


def paper_agent_run(seed: int) -> RunSpec:
    return RunSpec("dlt (paper agent)", "dlt", seed, dlt_variant="paper")


def runs_after_dlt(seed: int, final_map: list[int], final_distinct: int, average_distinct: float) -> list[RunSpec]:
    """Static layouts at DLT's final and at its time-averaged number of distinct blocks, and DLT's final map
    trained from scratch: what a learned schedule is measured against at the same budget."""
    average = max(1, round(average_distinct))
    runs = [RunSpec(f"{layout} @ final U", f"static:{layout}:{final_distinct}", seed) for layout in STATIC_LAYOUTS]
    runs += [RunSpec(f"{layout} @ mean U", f"static:{layout}:{average}", seed) for layout in STATIC_LAYOUTS]
    runs.append(final_map_from_scratch(FINAL_MAP_LABEL, seed, final_map))
    return runs


def final_map_from_scratch(label: str, seed: int, final_map: list[int]) -> RunSpec:
    """A strategy's final map as a static map from step 0: random's is the control for DLT's (are learned maps better
    than random ones?); similarity's is its map at the budget's memory (similarity itself trains every block for its
    warm-up, so its own peak is conventional training's)."""
    return RunSpec(label, "static:" + ",".join(map(str, final_map)), seed)


def runs_after(spec: RunSpec, result: dict, settings: BenchSettings, learning_rates: dict[str, float] | None = None) -> list[RunSpec]:
    """The runs a finished study run makes possible: DLT's (default agent, no other setting), random's and
    similarity's followers, at their own label's learning rate (`learning_rates`) or, without a table, at their leader's.
    None in the recipe presets: their agents are rows of the equal-memory comparison, not leaders."""
    if settings.recipe_rows:
        return []
    if spec.strategy == "dlt" and spec.dlt_variant == "default" and not spec.tying:
        followers = runs_after_dlt(spec.seed, result["final_map"], result["distinct_final"], result["distinct_mean"])
    elif spec.strategy == "random":
        followers = [final_map_from_scratch(RANDOM_FINAL_MAP_LABEL, spec.seed, result["final_map"])]
    elif spec.strategy.startswith("similarity:"):
        followers = [final_map_from_scratch(SIMILARITY_FINAL_MAP_LABEL, spec.seed, result["final_map"])]
    else:
        return []
    if learning_rates is None:
        return [dataclasses.replace(follower, learning_rate=spec.learning_rate) for follower in followers]
    return at_learning_rates(followers, learning_rates, settings)


def at_learning_rate(spec: RunSpec, rate: float, settings: BenchSettings) -> RunSpec:
    """`spec` trained at `rate`. At the preset's own rate it is the study's own run (no `-lr` in its folder): tuning
    then reuses the tuning seed's runs a study has made (`grid_seed`), and a study tuned afterwards keeps every run of
    a label whose chosen rate is the preset's."""
    return dataclasses.replace(spec, learning_rate=None if rate == settings.learning_rate else rate)


def at_learning_rates(specs: list[RunSpec], learning_rates: dict[str, float] | None, settings: BenchSettings) -> list[RunSpec]:
    """Each run at the learning rate chosen for its label, or for the label it takes its rate from (`rate_of`), in
    `learning_rates.json`; the preset's where none was chosen."""
    chosen = learning_rates or {}
    return [at_learning_rate(spec, chosen.get(spec.rate_of or spec.label, settings.learning_rate), settings) for spec in specs]


def memory_runs(settings: BenchSettings) -> list[RunSpec]:
    """At each depth: conventional training and DLT under the memory budget; and an untied model as deep as the
    budget, the equal-memory alternative (first seed); all of them without and with gradient checkpointing, as
    `memory_gradient_checkpointing` lists. None for `partial`, `recipe` and the loops presets: their rows hold at most 2U blocks' state."""
    if settings.partial_loops or settings.recipe_rows or settings.loop_study is not None:
        return []
    models = [(strategy, depth) for depth in settings.memory_depths for strategy in ("none", "dlt")]
    models.append(("none", settings.memory_max_distinct_blocks))
    return [
        RunSpec(strategy, strategy, settings.seeds[0], "memory", num_blocks=depth, gradient_checkpointing=checkpointing)
        for checkpointing in settings.memory_gradient_checkpointing
        for strategy, depth in models
    ]
