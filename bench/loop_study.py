"""The pre-registered study of the loop recipe (issue 76): what `bench/preregistration/looped-models.json` fixes
before the first fresh-seed run, read and checked in one place, and the rows it makes for each task.

The file holds the hypotheses, the seeds, the 0.05-nat margin for language, the recipe's values (and how they were
chosen) and, per task, the preset that trains it, its generated task (none for language), its
metric, the budget U and the looped layouts the recipe goes on. The rows of a task, in the order they train:

1. `untied, U blocks` (the equal-memory rival), `untied, 2U blocks` (the ceiling at twice the state), each layout
   alone, each layout under the whole recipe;
2. each layout under each part of the recipe alone;
3. each layout with the loop onset, alone and under the whole recipe; DLT under the recipe (the parts a moving map
   takes: not the adapters, which only fixed maps have).

`bench/run_bench.py --preset loops-<task>` trains them; `bench/settings.py` turns them into runs. This module reads
nothing from the bench's settings, so that both can import it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from hf_layertie import resolve_tying_map

from .provenance import git

REPO_ROOT = Path(__file__).resolve().parents[1]
PREREGISTRATION = REPO_ROOT / "bench" / "preregistration" / "looped-models.json"
Pairs = tuple[tuple[str, object], ...]
# What a part of the recipe may set: TyingTrainingArguments fields ("tying") and config fields ("config").
PART_KEYS = {"tying": ("loop_lr_exponent", "lora_rank", "lora_init", "loop_onset", "loop_schedule"), "config": ("loop_residual_scale", "loop_input_injection")}
# The recipe's parts a moving map (DLT) can take: adapters belong to fixed maps (TyingTrainingArguments refuses them).
MOVING_MAP_EXCLUDES = ("lora_rank", "lora_init")


@dataclass(frozen=True)
class LoopRow:
    """One row of a task: `strategy` and `num_blocks` as the study's runs take them, the recipe's settings as
    (name, value) pairs, `tier` which of the three groups above it belongs to, and `versus` the rows it is paired
    with, (contrast name, label) pairs: U and 2U untied blocks, and for a layout under a setting the same layout
    alone and, for a part of the recipe alone or the onset with the recipe, the layout under the whole recipe; for
    DLT, each layout under the recipe."""

    label: str
    strategy: str
    num_blocks: int
    tier: int
    tying: Pairs = ()
    looped_config: Pairs = ()
    versus: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RecipePart:
    """A named part of the recipe (or the onset, or the whole recipe): the settings it gives a run."""

    name: str
    tying: Pairs = ()
    looped_config: Pairs = ()


def read_preregistration(path: Path = PREREGISTRATION) -> dict:
    """The pre-registration as a dict, with its parts checked (one error naming the file and the key)."""
    try:
        registration = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: no pre-registration to read ({error})") from None
    for key in ("hypotheses", "seeds", "margin_nats", "recipe", "onset", "tasks"):
        if key not in registration:
            raise ValueError(f"{path}: the pre-registration has no {key!r}")
    for name, part in (*registration["recipe"].items(), ("onset", registration["onset"])):
        recipe_part(name, part, path)
    return registration


def preregistration_digest(task: str, path: Path = PREREGISTRATION) -> str:
    """SHA-256 (first 16 hex digits) of what the pre-registration fixes for `task`: every key but the other tasks.
    A results folder is claimed under it, so that no run is reported under another registration of its task, while
    a task registered later (a word problem chosen on seeds 0-4 after the others were registered) leaves the others'
    runs standing."""
    registration = read_preregistration(path)
    bearing = {key: value for key, value in registration.items() if key != "tasks"} | {"task": registration["tasks"][task]}
    return hashlib.sha256(json.dumps(bearing, sort_keys=True).encode()).hexdigest()[:16]


def registration_commit(task: str, digest: str, path: Path = PREREGISTRATION) -> str:
    """The commit holding the pre-registration as it is now, `task`'s part of it of `digest`: the last one to change
    the file in this checkout's history. A run starts only under a committed, unedited pre-registration, so every
    record names a commit its registration precedes (or is); outside git, or with the file edited since, or `task`'s
    part changed, one error says so."""
    commit = committed_as_is(path)
    if commit is None or preregistration_digest(task, path) != digest:
        raise ValueError(
            f"{path} is not committed as it is now, with task {task!r} registered as these settings were (digest "
            f"{digest}): commit the pre-registration before the first run it governs, and do not edit it afterwards"
        )
    return commit


def addendum_commit(path: Path) -> str:
    """The commit holding `path`, an addendum to the pre-registration (a later rival with a rule of its own, such
    as looped-language-compute.json), as it is now: a run of a preset that answers to it (`addendum`) records it, and
    starts only under it committed and unedited, so that its report needs no git history to show the registration
    came first. Outside git, or with the file uncommitted or edited since, one error says so."""
    commit = committed_as_is(path)
    if commit is None:
        raise ValueError(f"{path} is not committed as it is now: commit the addendum before the first run it governs, and do not edit it afterwards")
    return commit


def committed_as_is(path: Path) -> str | None:
    """The last commit to change `path` in its checkout's history, when the file is what that commit holds; None
    when it is untracked or edited since, or outside git."""
    commit = git("log", "-1", "--format=%H", "--", path.name, root=path.parent)
    unchanged = bool(commit) and git("diff", "--quiet", commit, "--", path.name, root=path.parent) is not None  # None: it differs
    return commit if unchanged else None


def recipe_part(name: str, settings: dict, path: Path = PREREGISTRATION) -> RecipePart:
    """A part of the recipe, `{"tying": {...}, "config": {...}}`, as (name, value) pairs; unknown keys refused."""
    pairs = {}
    for kind, allowed in PART_KEYS.items():
        given = settings.get(kind, {})
        unknown = sorted(set(given) - set(allowed))
        if unknown:
            raise ValueError(f"{path}: recipe part {name!r} sets {', '.join(unknown)} under {kind!r}; allowed: {', '.join(allowed)}")
        pairs[kind] = tuple(sorted(given.items()))
    if set(settings) - set(PART_KEYS) or not any(pairs.values()):
        raise ValueError(f"{path}: recipe part {name!r} must set something under 'tying' or 'config', and nothing else")
    return RecipePart(name, pairs["tying"], pairs["config"])


def layout_label(layout: str, positions: int) -> str:
    """A layout's row label: an explicit map in canonical form (each position names the first position with its
    weights), a named one (`cycle:4`) with its positions."""
    if not _explicit(layout):
        return f"{layout}, {positions} positions"
    return " ".join(map(str, resolve_tying_map(layout, positions).to_list()))


def task_rows(registration: dict, task: str) -> list[LoopRow]:
    """Every row of `task` (a key of the pre-registration's tasks), in the order they train."""
    plan = registration["tasks"][task]
    budget, depth = plan["budget"], plan["depth"]
    parts = [recipe_part(name, settings) for name, settings in registration["recipe"].items()]
    onset = recipe_part("onset", registration["onset"])
    whole = RecipePart("recipe", *_merged(parts))
    layouts = [(layout_label(layout, _positions(layout, depth)), layout) for layout in plan["layouts"]]
    untied, ceiling = f"untied, {budget} blocks", f"untied, {2 * budget} blocks"
    baselines = [("untied U", untied), ("untied 2U", ceiling)]  # named here, not found by the report: a row of each

    def under(layout: tuple[str, str], tier: int, *applied: RecipePart) -> LoopRow:
        """The layout under `applied`, paired with the layout alone and, for a part of the recipe alone or the onset
        with the whole recipe, with the layout under the whole recipe (the onset alone is the layout's own question)."""
        label, arrangement = layout
        tying, config = _merged(applied)
        versus = [*baselines, ("layout alone", label)]
        if applied[0] in parts or applied[-1] is whole and len(applied) > 1:
            versus.append(("whole recipe", f"{label} + {whole.name}"))
        name = " + ".join(part.name for part in applied)
        return LoopRow(f"{label} + {name}", _static(arrangement), _positions(arrangement, depth), tier, tying, config, tuple(versus))

    rows = [LoopRow(untied, "none", budget, 1, versus=(("untied 2U", ceiling),)), LoopRow(ceiling, "none", 2 * budget, 1)]
    rows += [LoopRow(label, _static(arrangement), _positions(arrangement, depth), 1, versus=tuple(baselines)) for label, arrangement in layouts]
    rows += [under(layout, 1, whole) for layout in layouts]
    rows += [under(layout, 2, part) for layout in layouts for part in parts]
    rows += [under(layout, 3, onset) for layout in layouts]
    rows += [under(layout, 3, onset, whole) for layout in layouts]
    moving = [RecipePart(part.name, tuple(pair for pair in part.tying if pair[0] not in MOVING_MAP_EXCLUDES), part.looped_config) for part in parts]
    tying, config = _merged(moving)
    versus = (*baselines, *((f"{label} + {whole.name}", f"{label} + {whole.name}") for label, _ in layouts))
    rows.append(LoopRow("dlt + recipe", "dlt", depth, 3, tying, config, versus))
    return rows


def _positions(layout: str, depth: int) -> int:
    """Positions of a layout: an explicit map's length, or the task's depth for a named layout (`cycle:4`)."""
    return len(layout.split(",")) if _explicit(layout) else depth


def _explicit(layout: str) -> bool:
    return layout[:1].isdigit()


def _static(layout: str) -> str:
    return f"static:{layout}"


def _merged(parts) -> tuple[Pairs, Pairs]:
    tying = tuple(sorted(pair for part in parts for pair in part.tying))
    config = tuple(sorted(pair for part in parts for pair in part.looped_config))
    return tying, config
