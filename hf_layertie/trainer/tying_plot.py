"""The picture of a tying run: which block every block used, over training."""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np

# The plot's file name, beside the model and in its card.
TYING_PLOT_NAME = "tying_map.png"


def plot_tying_history(
    records: list[dict],
    path: str | Path,
    final_step: int | None = None,
    saved_step: int | None = None,
    skipped: list[dict] | None = None,
) -> Path:
    """Draw blocks (rows) x training steps (columns), each cell coloured by the block whose weights it used.

    Args:
        records: decisions in order, each with `step` (optimizer step the map took effect) and `map`
            (list of source blocks). The map of a record holds until the next record's step.
        path: the PNG to write.
        final_step: the last step of training, so the last map gets its width (defaults to the last record's step + 1).
        saved_step: the step whose weights and map were saved, where it is not the last (the best checkpoint,
            loaded at the end): marked by a line, since the map drawn after it is not the saved model's.
        skipped: the positions training skipped (the identity), as change points `{"step", "skipped"}`
            (`loop_schedule.skipped_over_training`): drawn grey, where a looped model's repeats were off.

    A second panel shows the number of distinct (trainable) blocks, the memory that tying saves, and with skipped
    positions the number computed, the time a step costs.
    """
    if not records:
        raise ValueError("plot_tying_history needs at least one record with 'step' and 'map'")
    Figure, ListedColormap, colormaps = require_matplotlib()
    steps = [int(record["step"]) for record in records]
    end = max(final_step if final_step is not None else steps[-1] + 1, steps[-1] + 1)
    changes = [change for change in skipped or [] if change["step"] < end]
    starts = sorted(set(steps) | {change["step"] for change in changes})
    maps = np.array([records[_in_force(steps, start)]["map"] for start in starts], dtype=int)
    change_steps = [change["step"] for change in changes]
    skips = [changes[_in_force(change_steps, start)]["skipped"] or [] if changes and start >= change_steps[0] else [] for start in starts]
    edges = np.array(starts + [end])
    num_blocks = maps.shape[1]

    colours = colormaps["tab20" if num_blocks > 10 else "tab10"]
    cmap = ListedColormap([colours(index % colours.N) for index in range(num_blocks)])
    # The object-oriented API draws into a file without pyplot, so the user's backend and figures are untouched.
    figure = Figure(figsize=(10, 2.0 + 0.35 * num_blocks))
    map_axis, count_axis = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [4, 1]})
    mesh = map_axis.pcolormesh(edges, np.arange(num_blocks + 1), maps.T, cmap=cmap, vmin=-0.5, vmax=num_blocks - 0.5)
    map_axis.set_ylabel("block")
    map_axis.set_yticks(np.arange(num_blocks) + 0.5, [str(block) for block in range(num_blocks)])
    map_axis.invert_yaxis()
    map_axis.set_title("Tying map over training (colour = block whose weights are used)")
    colourbar = figure.colorbar(mesh, ax=[map_axis, count_axis], ticks=range(num_blocks), fraction=0.03)
    colourbar.set_label("source block")
    if any(skips):
        mask = np.array([[position in row for position in range(num_blocks)] for row in skips])
        grey = np.ma.masked_where(~mask.T, np.zeros(mask.T.shape))
        map_axis.pcolormesh(edges, np.arange(num_blocks + 1), grey, cmap=ListedColormap(["lightgrey"]), vmin=0, vmax=1)
        map_axis.set_title(f"{map_axis.get_title()}; grey: skipped (the identity)")

    distinct = [len(set(row)) for row in maps.tolist()]
    count_axis.step(edges, distinct + [distinct[-1]], where="post", label="distinct")
    if any(skips):
        computed = [num_blocks - len(row) for row in skips]
        count_axis.step(edges, computed + [computed[-1]], where="post", label="computed", linestyle="--")
        count_axis.legend(loc="lower right", fontsize="small")
    count_axis.set_ylim(0, num_blocks + 0.5)
    count_axis.set_ylabel("blocks")
    count_axis.set_xlabel("optimizer step")
    if saved_step is not None and saved_step < end:
        for axis in (map_axis, count_axis):
            axis.axvline(saved_step, color="black", linestyle="--", linewidth=1.5)
        map_axis.set_title(f"{map_axis.get_title()}; dashed: step {saved_step}, the saved model's")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _in_force(starts: list[int], step: int) -> int:
    """The index of the change point in force at `step` (the last starting at or before it; the first before any)."""
    return max(bisect.bisect_right(starts, step) - 1, 0)


def require_matplotlib():
    """matplotlib's figure, colour map class and colour maps, imported only when a plot is drawn (an optional
    extra); `TyingTrainer` calls it when it is built, and draws no plot, saying so once, where it is missing."""
    try:
        from matplotlib import colormaps
        from matplotlib.colors import ListedColormap
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "Drawing the tying plot needs matplotlib: pip install 'hf-layertie[plot]' (or pass tying_plot=False)"
        ) from error
    return Figure, ListedColormap, colormaps
