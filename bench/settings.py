"""Command-line arguments and presets of the benchmark.

A preset fixes every size of the comparison (model, data, steps, evaluation caps, memory sweep); any of
them can be overridden by its flag. Every strategy of one bench is trained with the same settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WIKITEXT = REPO_ROOT.parent / "shared" / "data" / "wikitext-2" / "test.txt"


@dataclass(frozen=True)
class BenchSettings:
    """Everything that sizes one bench. `None` caps mean "all of it"; `num_threads=None` keeps torch's default."""

    n_layer: int
    n_embd: int
    n_head: int
    block_size: int
    max_steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    tying_interval: int
    epsilon_decay: float
    reward_batch_size: int
    max_eval_blocks: int | None
    wikitext_max_tokens: int | None
    memory_depths: tuple[int, ...]
    memory_n_embd: int
    memory_n_head: int
    memory_batch_size: int
    memory_steps: int
    seed: int = 42
    num_threads: int | None = None
    use_gpu: bool = False


PRESETS: dict[str, BenchSettings] = {
    # The whole bench in under 2 minutes on 2 CPU cores (most of it is starting 8 Python processes).
    "tiny": BenchSettings(
        n_layer=4,
        n_embd=32,
        n_head=2,
        block_size=32,
        max_steps=12,
        batch_size=4,
        learning_rate=3e-3,
        warmup_steps=0,
        tying_interval=2,
        epsilon_decay=0.5,
        reward_batch_size=8,
        max_eval_blocks=16,
        wikitext_max_tokens=512,
        memory_depths=(24, 48),
        memory_n_embd=32,
        memory_n_head=2,
        memory_batch_size=2,
        memory_steps=1,
        num_threads=1,
    ),
    # 12 blocks on a 2-core CPU: about an hour for the whole bench (see bench/README.md for the measured estimate).
    "default": BenchSettings(
        n_layer=12,
        n_embd=128,
        n_head=4,
        block_size=128,
        max_steps=200,
        batch_size=8,
        learning_rate=1e-3,
        warmup_steps=20,
        tying_interval=5,
        epsilon_decay=0.6,
        reward_batch_size=16,
        max_eval_blocks=None,
        wikitext_max_tokens=16384,
        memory_depths=(24, 48),
        memory_n_embd=256,
        memory_n_head=4,
        memory_batch_size=2,
        memory_steps=2,
    ),
    # GPT-2 small's shape on one GPU.
    "gpu": BenchSettings(
        n_layer=12,
        n_embd=768,
        n_head=12,
        block_size=512,
        max_steps=3000,
        batch_size=16,
        learning_rate=3e-4,
        warmup_steps=100,
        tying_interval=15,
        epsilon_decay=0.85,
        reward_batch_size=16,
        max_eval_blocks=None,
        wikitext_max_tokens=None,
        memory_depths=(24, 48),
        memory_n_embd=768,
        memory_n_head=12,
        memory_batch_size=4,
        memory_steps=3,
        use_gpu=True,
    ),
}

_FROM_PRESET = "None = the preset's value."


def _override(help_text: str) -> dict:
    return field(default=None, metadata={"help": f"{help_text} {_FROM_PRESET}"})


@dataclass
class BenchArguments:
    """Flags of `bench/run_bench.py`. Size flags left unset take the preset's value."""

    preset: Literal["tiny", "default", "gpu"] = field(
        default="default",
        metadata={
            "help": "tiny: < 2 min on 2 CPU cores. default: 12 blocks, about 1 h on 2 CPU cores. gpu: GPT-2 small."
        },
    )
    results_dir: str | None = field(
        default=None,
        metadata={"help": "Where results.md, results.json and the plots go. Default: bench/results/<preset>."},
    )
    wikitext_file: str | None = field(
        default=None,
        metadata={
            "help": "WikiText-2 test split (plain text) for the out-of-domain perplexity. Default: "
            "../shared/data/wikitext-2/test.txt beside the repository. If missing, the table says so."
        },
    )
    skip_memory: bool = field(default=False, metadata={"help": "Skip the memory sweep over deep models."})
    memory_only: bool = field(default=False, metadata={"help": "Run only the memory sweep over deep models."})
    n_layer: int | None = _override("Blocks of the compared models.")
    n_embd: int | None = _override("Hidden size of the compared models.")
    n_head: int | None = _override("Attention heads of the compared models.")
    block_size: int | None = _override("Tokens per example (also the models' context).")
    max_steps: int | None = _override("Optimizer steps of every run.")
    batch_size: int | None = _override("Examples per optimizer step.")
    learning_rate: float | None = _override("Peak learning rate (AdamW, linear decay).")
    warmup_steps: int | None = _override("Linear warm-up steps.")
    tying_interval: int | None = _override("k: optimizer steps between two decisions of dlt / random.")
    epsilon_decay: float | None = _override(
        "DLT's exploration decay per sweep over the blocks (the paper's 0.95 needs more decisions than a bench makes)."
    )
    reward_batch_size: int | None = _override("Training blocks held out (from every run) as the agent's reward batch.")
    max_eval_blocks: int | None = _override(
        "Cap on Shakespeare validation blocks evaluated (presets default/gpu: all)."
    )
    wikitext_max_tokens: int | None = _override("Cap on WikiText-2 test tokens evaluated (preset gpu: all).")
    memory_depths: str | None = _override("Comma-separated block counts of the memory sweep, e.g. '24,48'.")
    memory_n_embd: int | None = _override("Hidden size of the memory-sweep models.")
    memory_n_head: int | None = _override("Attention heads of the memory-sweep models.")
    memory_batch_size: int | None = _override("Examples per step in the memory sweep.")
    memory_steps: int | None = _override("Optimizer steps per memory-sweep model.")
    seed: int | None = _override("Seed of data order, initial weights and agent.")
    num_threads: int | None = _override("torch intra-op threads (presets default/gpu: torch's default).")
    use_gpu: bool | None = _override("'true': train on the CUDA GPU (preset gpu does); 'false': on the CPU.")
    single_run: str | None = field(
        default=None,
        metadata={"help": "Internal: train and measure only this strategy, in this process, and write its JSON."},
    )
    single_run_output: str | None = field(
        default=None, metadata={"help": "Internal: the JSON file --single_run writes."}
    )

    def __post_init__(self):
        if self.skip_memory and self.memory_only:
            raise ValueError("--skip_memory and --memory_only exclude each other")
        if self.single_run is not None and self.single_run_output is None:
            raise ValueError("--single_run needs --single_run_output (the JSON file to write)")


def resolve_settings(args: BenchArguments) -> BenchSettings:
    """The preset with every flag the user set applied on top, checked."""
    overrides = {
        setting.name: getattr(args, setting.name)
        for setting in dataclasses.fields(BenchSettings)
        if getattr(args, setting.name, None) is not None
    }
    if "memory_depths" in overrides:
        overrides["memory_depths"] = _parse_depths(overrides["memory_depths"])
    settings = dataclasses.replace(PRESETS[args.preset], **overrides)
    _check(settings)
    return settings


def _parse_depths(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdecimal() and int(part) >= 1 for part in parts):
        raise ValueError(f"--memory_depths {text!r}: expected comma-separated positive block counts, e.g. '24,48'")
    return tuple(int(part) for part in parts)


def _check(settings: BenchSettings) -> None:
    positive = (
        "n_layer", "n_embd", "n_head", "block_size", "max_steps", "batch_size", "tying_interval",
        "reward_batch_size", "memory_n_embd", "memory_n_head", "memory_batch_size", "memory_steps",
    )  # fmt: skip
    for name in positive:
        if getattr(settings, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(settings, name)}")
    for name in ("max_eval_blocks", "wikitext_max_tokens", "num_threads"):
        value = getattr(settings, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    if settings.learning_rate <= 0:
        raise ValueError(f"--learning_rate must be > 0, got {settings.learning_rate}")
    if not 0 < settings.epsilon_decay <= 1:
        raise ValueError(f"--epsilon_decay must be in (0, 1], got {settings.epsilon_decay}")
    for size, heads, prefix in (
        (settings.n_embd, settings.n_head, ""),
        (settings.memory_n_embd, settings.memory_n_head, "memory_"),
    ):
        if size % heads:
            raise ValueError(f"--{prefix}n_embd {size} must be divisible by --{prefix}n_head {heads}")


def results_dir(args: BenchArguments) -> Path:
    return Path(args.results_dir) if args.results_dir is not None else REPO_ROOT / "bench" / "results" / args.preset


def wikitext_path(args: BenchArguments) -> Path:
    return Path(args.wikitext_file) if args.wikitext_file is not None else DEFAULT_WIKITEXT


def distinct_counts(num_blocks: int) -> list[int]:
    """U = 1, 2, 4, 8, ... below `num_blocks`, then `num_blocks` itself (no tying)."""
    counts = []
    distinct = 1
    while distinct < num_blocks:
        counts.append(distinct)
        distinct *= 2
    return counts + [num_blocks]


def compared_strategies(dlt_distinct: int) -> list[str]:
    """The strategies run after DLT; the static ones with U distinct blocks take U from DLT's final map."""
    return [
        "none",
        "random",
        "static:all",
        f"static:sequence:{dlt_distinct}",
        f"static:cycle:{dlt_distinct}",
        f"static:cycle_rev:{dlt_distinct}",
        "static:sandwich",
    ]
