"""The one owner of what a `TyingTrainer` checkpoint holds and when it counts as complete.

A checkpoint (`checkpoint-N/`, and the output folder of a finished run) is the Trainer's files plus
`tying_state.pt`: the strategy, the settings it ran under, its decisions' state (`TyingDecisions.state_dict`), the
model the run started from and the run's training totals so far (`TrainingTotals`, under `training`), stamped with
the layout's `format_version`. `read_tying_state` brings every readable layout to the current one in one place
(`migrate_tying_state`), so that what reads a state finds every key of the current layout.
The model's `config.json` holds the map of that step. `tying_state.pt` is written last and atomically, for every
strategy (`none` included), so a checkpoint that has it is complete; one without it was interrupted while saving
(or a plain Trainer saved it), and a tying run refuses to continue it.

A kill, a crash or a full disk in the middle of a save leaves a `checkpoint-N` folder without some of its files.
transformers' `get_last_checkpoint` picks the highest-numbered folder whatever it holds; `last_complete_checkpoint`
skips incomplete ones.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import zipfile
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    CONFIG_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_NAME,
)

from ..checks import reworded
from ..decisions import DECISIONS, split_strategy
from ..models.tying_map import TyingMap
from .training_args import DISTILLATION_SETTINGS, LOOP_SETTINGS, TyingTrainingArguments

logger = logging.getLogger(__name__)

TYING_STATE_NAME = "tying_state.pt"
# The layout `write_tying_state` writes. 1: the first stamped (hf-layertie 0.1.0); a change of layout raises it and
# adds its step to `migrate_tying_state`.
TYING_STATE_FORMAT_VERSION = 1
# What every layout since 0 holds (0: the unstamped states of 0.1.0 before versions, which hold 1's keys);
# `checkpoint_sha256` is there too in a `checkpoint-N` (a finished run's folder is saved without one).
TYING_STATE_KEYS = frozenset({"tying_strategy", "settings", "decisions", "starting_model", "training"})
# What makes a file a tying state of any layout, pre-release ones included.
_EVERY_LAYOUTS_KEYS = frozenset({"tying_strategy", "settings", "decisions"})
# Any of these holds a checkpoint's weights; a PEFT model's checkpoint holds only its adapters, beside their config.
WEIGHTS_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME)
ADAPTER_WEIGHTS_FILES = (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)
_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def tying_state_of(args: TyingTrainingArguments, decisions_state: dict, model, training: dict) -> dict:
    """A run's tying state in the current layout: the strategy and its settings (`saved_settings`), the decisions'
    state (`TyingEngine.state_dict`), the model the run started from and its training totals so far."""
    return {
        "tying_strategy": args.tying_strategy,
        "settings": args.saved_settings(),
        "decisions": decisions_state,
        "starting_model": starting_model(model),
        "training": training,
    }


def write_tying_state(folder: str | Path, state: dict) -> None:
    """Write `state` as `folder/tying_state.pt` in the current layout (`TYING_STATE_FORMAT_VERSION`), atomically: a
    kill leaves the old file or none, never half of one."""
    partial = os.path.join(folder, TYING_STATE_NAME + ".partial")
    with explain_write_errors(folder):
        torch.save({**state, "format_version": TYING_STATE_FORMAT_VERSION}, partial)
        os.replace(partial, os.path.join(folder, TYING_STATE_NAME))


def save_trainer_state(state: TrainerState, output_dir: str | Path) -> None:
    """Write `trainer_state.json` into `output_dir` atomically: the final one is what tells a re-run that the run
    finished, so a kill while it is written leaves the old file or none, never half of one."""
    path = os.path.join(output_dir, TRAINER_STATE_NAME)
    with explain_write_errors(output_dir):
        state.save_to_json(path + ".partial")
        os.replace(path + ".partial", path)


def read_tying_state(checkpoint: str | Path) -> dict | None:
    """The checkpoint's `tying_state.pt` in the current layout (None when it has none), or one error naming the
    file."""
    path = os.path.join(checkpoint, TYING_STATE_NAME)
    if not os.path.isfile(path):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a truncated or foreign file
        raise ValueError(f"{path} is not a readable tying state ({type(error).__name__}: {error})") from None
    if not isinstance(state, dict) or not _EVERY_LAYOUTS_KEYS <= state.keys():
        raise ValueError(f"{path} is not a tying state: expected a dict with the keys {sorted(_EVERY_LAYOUTS_KEYS)}")
    return migrate_tying_state(state, path)


def migrate_tying_state(state: dict, path: str) -> dict:
    """`state` (read from `path`) in the current layout, or one error naming the file and what to do.

    - A newer layout than this version writes is refused: its keys may mean what this version cannot know.
    - Layout 0 (unstamped) becomes 1 as it is, once it holds `TYING_STATE_KEYS`; a tying setting added since a
      state was saved gets the value that run had, its default (the strategy's, unset for the others). States of
      the pre-release layouts before it, without training totals or the starting model, are refused: no release
      ever wrote them.
    """
    version = state.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"{path} has tying state format {version!r}, not a format version: not a tying state hf-layertie wrote")
    if version > TYING_STATE_FORMAT_VERSION:
        raise ValueError(
            f"{path} has tying state format {version!r}, newer than this hf-layertie reads "
            f"({TYING_STATE_FORMAT_VERSION}): upgrade hf-layertie to resume it"
        )
    decisions = DECISIONS.get(split_strategy(state["tying_strategy"])[0])
    nested = {"rows", "pending_row", *(decisions.state_keys if decisions is not None else ())}
    missing = sorted(TYING_STATE_KEYS - state.keys()) + sorted(nested - set(state["decisions"]))
    if missing:
        raise ValueError(
            f"{path} holds a tying state of a pre-release layout (without {', '.join(missing)}), which this version "
            f"does not resume: train into a new output_dir, or resume with the version that saved it"
        )
    defaults = {**(decisions.setting_defaults() if decisions is not None else {}), **dict.fromkeys((*DISTILLATION_SETTINGS, *LOOP_SETTINGS))}
    return {**state, "settings": {**defaults, **state["settings"]}, "format_version": TYING_STATE_FORMAT_VERSION}


def checkpoint_digest(folder: str | Path) -> str | None:
    """A SHA-256 of what identifies a checkpoint's run and step (None without a trainer state): its
    `trainer_state.json` and the first MiB of each weights file (two runs of one recipe can log the same trainer
    state; their weights differ). A checkpoint's tying state records it, taken just before the tying state is
    written: the two then belong to one run and one step. Cheap: a MiB per file, whatever the model's size."""
    folder = Path(folder)
    if not (folder / TRAINER_STATE_NAME).is_file():
        return None
    digest = hashlib.sha256((folder / TRAINER_STATE_NAME).read_bytes())
    for name in (*WEIGHTS_FILES, *ADAPTER_WEIGHTS_FILES):
        if (folder / name).is_file():
            with open(folder / name, "rb") as weights:
                digest.update(weights.read(2**20))
    return digest.hexdigest()


def check_tying_state_belongs(checkpoint: str | Path, state: dict | None) -> None:
    """Refuse a checkpoint whose `tying_state.pt` was saved beside another trainer state and weights (`checkpoint_digest`:
    copied from another run or step): resuming would take that run's decisions and training totals. A finished run's
    output folder (its trainer state is written after the tying state, without a digest) is not checked."""
    saved = None if state is None else state.get("checkpoint_sha256")
    if saved is not None and saved != checkpoint_digest(checkpoint):
        raise ValueError(
            f"cannot resume from {checkpoint}: its {TYING_STATE_NAME} was saved beside another {TRAINER_STATE_NAME} "
            f"and weights (copied from another run or step): resuming would take that run's decisions and training totals. Put "
            f"back the checkpoint's own {TYING_STATE_NAME}, or resume from another checkpoint"
        )


def starting_model(model) -> str:
    """Where `model` was loaded from, as a tying state records it: its folder (absolute) or Hub id, "" when it was
    built from scratch. A run with `untie_init="own"` unties blocks to the weights they had in that model."""
    source = getattr(model, "name_or_path", "")  # tying_strategy="none" takes any torch module
    return os.path.realpath(source) if os.path.isdir(source) else source


def check_resumes_starting_model(checkpoint: str | Path, state: dict | None, untie_init: str | None, model) -> None:
    """Refuse to continue an `untie_init="own"` run with a model loaded from elsewhere than the one it started from
    (`state["starting_model"]`): blocks it unties would take the other model's weights."""
    if untie_init != "own" or state is None:
        return
    saved, current = state["starting_model"], starting_model(model)
    if saved == current:
        return
    raise ValueError(
        f"cannot resume from {checkpoint}: its run (untie_init='own') started from {_model_origin(saved)} and unties "
        f"blocks to their weights there, and this run's model comes from {_model_origin(current)}. Load the model "
        f"from {saved or 'scratch'} to continue that run (--model_name_or_path in the scripts), or train into a new "
        f"output_dir"
    )


def _model_origin(source: str) -> str:
    return source if source else "a model built from scratch"


def checkpoint_tying_map(checkpoint: str | Path, num_blocks: int) -> TyingMap:
    """The map saved in a checkpoint's config.json (independent blocks when it has none)."""
    path = os.path.join(checkpoint, CONFIG_NAME)
    entries = read_json(path).get("tying_map")
    try:
        return TyingMap.independent(num_blocks) if entries is None else TyingMap(entries, num_blocks=num_blocks)
    except ValueError as error:
        raise ValueError(f"cannot resume from {checkpoint}: the map in {path} does not fit this model: {error}") from None


def checkpoint_step(checkpoint: str | Path) -> int | None:
    """The optimizer step a checkpoint (or finished output folder) was saved at; None without its trainer state."""
    path = os.path.join(checkpoint, TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        return None
    return int(read_json(path).get("global_step", 0))


def read_json(path: str | Path) -> dict:
    """A JSON file a run wrote (trainer_state.json, config.json), or one error naming it and the way on: a damaged
    one (a kill or a full disk while it was written) makes every re-run fail where json would say only where."""
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is damaged ({type(error).__name__}: {error}): {_way_past(Path(path).parent)}") from None


def _way_past(folder: Path) -> str:
    """What to do with a damaged file in `folder`: a checkpoint's folder can go, a run resumes from the one before;
    a finished run's output folder without its trainer state is finished from its last checkpoint."""
    if _CHECKPOINT_NAME.match(folder.name):
        return f"delete the folder {folder}, and a re-run resumes from the complete checkpoint before it (or starts again)"
    return (
        f"delete the damaged file, and a re-run of the same command goes on from the last complete checkpoint in "
        f"{folder} (or pass a new --output_dir)"
    )


def damaged_checkpoint_files(checkpoint: str | Path) -> list[str]:
    """The files of `checkpoint` that cannot be read, each as "name (error)": JSON that does not parse, safetensors
    whose header does not, torch files whose zip directory is not there (a truncated file ends before it). Cheap:
    no tensor is read."""
    damaged = []
    for path in sorted(Path(checkpoint).iterdir()):
        try:
            if path.suffix == ".json":
                json.loads(path.read_text(encoding="utf-8"))
            elif path.suffix == ".safetensors":
                with safe_open(path, framework="pt"):
                    pass
            elif path.suffix in (".pt", ".bin", ".pth"):
                zipfile.ZipFile(path).close()
        except (ValueError, OSError, SafetensorError, zipfile.BadZipFile) as error:
            damaged.append(f"{path.name} ({type(error).__name__}: {error})")
    return damaged


def check_checkpoint_readable(checkpoint: str | Path) -> None:
    """Refuse to resume from a checkpoint with a damaged file, naming it (transformers' errors do not)."""
    damaged = damaged_checkpoint_files(checkpoint)
    if damaged:
        raise ValueError(f"cannot resume from {checkpoint}: damaged {'; '.join(damaged)}. To go on, {_way_past(Path(checkpoint))}")


def missing_checkpoint_files(checkpoint: str | Path) -> list[str]:
    """The files a complete checkpoint has and `checkpoint` lacks (empty: it is complete).

    A checkpoint saved under other settings is complete: resuming from it is refused by the trainer, naming the
    difference, rather than skipped.
    """
    checkpoint = Path(checkpoint)
    # A PEFT model (adapters trained on a fixed map, with tying_strategy="none") saves its adapters and their config.
    config, weights = (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_FILES) if (checkpoint / ADAPTER_CONFIG_NAME).is_file() else (CONFIG_NAME, WEIGHTS_FILES)
    missing = [name for name in (config, TRAINER_STATE_NAME) if not (checkpoint / name).is_file()]
    if not any((checkpoint / name).is_file() for name in weights):
        missing.append(" or ".join(weights))
    if not (checkpoint / TYING_STATE_NAME).is_file():
        missing.append(TYING_STATE_NAME)
    return missing


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The highest-numbered complete `checkpoint-N` in `output_dir`; incomplete ones are skipped with a warning."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    numbered = [(int(match.group(1)), path) for path in output_dir.iterdir() if (match := _CHECKPOINT_NAME.match(path.name))]
    for _, checkpoint in sorted(numbered, reverse=True):
        missing = missing_checkpoint_files(checkpoint)
        damaged = [] if missing else damaged_checkpoint_files(checkpoint)
        if not missing and not damaged:
            return checkpoint
        problem = f"an interrupted save left it without {', '.join(missing)}" if missing else f"damaged {'; '.join(damaged)}"
        logger.warning(f"Skipping {checkpoint}: {problem}")
    return None


# How torch and safetensors report a full disk, without the words "no space left".
_FULL_DISK_SIGNS = ("unexpected pos", "iostream error", "file write failed")


@contextmanager
def explain_write_errors(folder: str | Path):
    """Re-raise an error raised while writing `folder` naming the folder, the free space left and the way on (the
    last complete checkpoint, which a re-run resumes from). Only an error that reads as a full disk (`ENOSPC`,
    `EDQUOT`, or torch's and safetensors' words for it: "[enforce fail at inline_container.cc] unexpected pos",
    "basic_ios::clear: iostream error", "file write failed") is said to be one: a device or collective error raised
    while saving is not blamed on the disk.
    """
    try:
        yield
    except (OSError, RuntimeError) as error:
        full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        full = full or any(sign in str(error) for sign in _FULL_DISK_SIGNS)
        free = _free_bytes(folder)
        output_dir = Path(folder).parent if _CHECKPOINT_NAME.match(Path(folder).name) else Path(folder)
        last = last_complete_checkpoint(output_dir)
        way_on = f"it resumes from {last}, the last complete checkpoint" if last else "no checkpoint is complete yet"
        message = (
            f"could not write {folder} ({free / 2**20:,.0f} MiB free on its disk"
            f"{'; the disk may be full' if full else ''}): {type(error).__name__}: {error}. "
            f"{'Free some space' if full else 'Mend the cause'} and re-run the same command: {way_on}"
        )
        raise reworded(error, message) from error


def _free_bytes(folder: str | Path) -> int:
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free
