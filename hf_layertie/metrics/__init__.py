"""Metrics shipped as `evaluate` modules, so they load offline (Hub metrics are unreachable there).

Each metric is an `evaluate.Metric` subclass in `<name>/<name>.py`; `evaluate.load(<folder>)` imports
it from the package instead of downloading it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import evaluate

METRICS_DIR = Path(__file__).resolve().parent
METRIC_NAMES = ("hop_accuracy", "lambada_accuracy", "perplexity_from_nll")


def metric_dir(name: str) -> Path:
    """Folder of a shipped metric, for `evaluate.load(str(metric_dir(name)))`."""
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; shipped metrics are {list(METRIC_NAMES)}")
    return METRICS_DIR / name


def load_metric(name: str, **load_kwargs) -> evaluate.EvaluationModule:
    """`evaluate.load` a shipped metric by name; `load_kwargs` go to `evaluate.load` (e.g. experiment_id). `evaluate`
    is imported here, not with the package: it pulls in scipy (about 2 s), which the processes that never score a
    metric (every benchmark run on the plays) would pay at start."""
    import evaluate

    return evaluate.load(str(metric_dir(name)), **load_kwargs)


__all__ = ["METRIC_NAMES", "load_metric", "metric_dir"]
