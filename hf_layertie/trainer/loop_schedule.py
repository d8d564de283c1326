"""Depth schedules for looped models: which block positions a training step computes (`loop_onset`, `loop_schedule`).

A position is *repeated* when its block's weights were already used at an earlier position (its occurrence index,
`TyingMap.occurrences`, is above 0): in `0 1 1 1` positions 2 and 3, in `cycle:2` over 6 positions the last 4. Before
the onset step (`loop_onset` x `max_steps`) the trainer skips some of them (`config.skipped_positions`, the
identity: `hf_layertie.models.TiedBlocksMixin.computing_only`), from it on every position computes:

- `"onset"`: every repeated position is skipped until the onset, then the loops switch on at once. The late onset
  of parameter-golf's looped records (about 35% of the steps), which train the unique blocks first.
- `"progressive"`: one pass first (each block once), then a pass more at each of the equal stages before the onset
  (one pass, then two, ...), as progressive depth schedules of looped models grow the loop count.

The positions skipped at a step are a function of the step and the map in force alone: a run resumed from any
checkpoint, before or after the switch, computes exactly what the uninterrupted run does.
"""

from __future__ import annotations

import bisect
import math

from ..models.tying_map import TyingMap

LOOP_SCHEDULES = ("onset", "progressive")


def skipped_positions_at(step: int, max_steps: int, tying_map: TyingMap, onset: float, schedule: str) -> list[int] | None:
    """The positions a training step skips (None: every position computes). `step` counts the optimizer steps done."""
    switch = math.ceil(onset * max_steps)
    if step >= switch:
        return None
    occurrences = tying_map.occurrences()
    passes = 1 if schedule == "onset" else 1 + step * (max(occurrences) + 1) // switch
    return [position for position, occurrence in enumerate(occurrences) if occurrence >= passes] or None


def check_loop_settings(loop_onset: float | None, loop_schedule: str | None) -> None:
    """`loop_onset` in (0, 1); `loop_schedule` one of `LOOP_SCHEDULES`, and only with an onset."""
    if loop_onset is None:
        if loop_schedule is not None:
            raise ValueError(f"loop_schedule={loop_schedule!r} only applies with loop_onset: set loop_onset or leave it unset")
        return
    if isinstance(loop_onset, bool) or not isinstance(loop_onset, (int, float)) or not 0 < loop_onset < 1:
        raise ValueError(f"loop_onset must be a fraction of max_steps in (0, 1), got {loop_onset!r}")
    if loop_schedule not in LOOP_SCHEDULES:
        raise ValueError(f"loop_schedule must be one of {', '.join(LOOP_SCHEDULES)}, got {loop_schedule!r}")


def skipped_over_training(
    records: list[dict], end_step: int, max_steps: int, onset: float | None, schedule: str | None, fixed: list[int] | None = None
) -> list[dict]:
    """What the steps `0 .. end_step - 1` skipped, as change points `{"step", "skipped"}` (`skipped` None: every
    position), for the tying plot. `records` are the tying history's rows (`step`, `map`); without an onset, the
    `fixed` positions (the config's) were skipped throughout. Recomputed rather than logged: a function of the step
    and the map alone (`skipped_positions_at`), so a resumed run draws what the uninterrupted one would."""
    if onset is None:
        return [{"step": 0, "skipped": fixed}] if fixed else []
    steps = [int(record["step"]) for record in records]
    maps = [TyingMap(record["map"]) for record in records]
    changes: list[dict] = []
    for step in range(min(end_step, math.ceil(onset * max_steps)) + 1):
        in_force = max(bisect.bisect_right(steps, step) - 1, 0)
        skipped = skipped_positions_at(step, max_steps, maps[in_force], onset, schedule)
        if not changes or changes[-1]["skipped"] != skipped:
            changes.append({"step": step, "skipped": skipped})
    return changes
