"""Checks of user-given settings that raise one `ValueError` naming the setting, its value and what was expected,
`reworded`, an error raised again with a message that names the setting or file, and `perplexity`, the guarded `exp`
of a loss.

Shared by every layer that takes settings (`dlt.AgentConfig`, `dlt.TyingReward`, `TyingTrainingArguments`), so a
setting is checked, and its error worded, the same way wherever it is given; and by every layer that turns a loss
into a perplexity (the reward, the model card, the scripts' report), so a diverged loss gives the same number in each.
"""

from __future__ import annotations

import math
from numbers import Integral, Real


def reworded(error: BaseException, message: str) -> BaseException:
    """An error of `error`'s type carrying `message`, so that whoever catches that type still does; of its nearest
    base whose constructor takes a message alone where its own takes more (json's `JSONDecodeError`)."""
    for kind in type(error).__mro__:  # ends with BaseException, which takes any message
        try:
            return kind(message)
        except TypeError:
            continue


def check_integer(name: str, value, minimum: int | None = None) -> None:
    """Raise unless `value` is an integer (not a bool), at least `minimum` when given, and below 2**63."""
    in_range = minimum is None or (isinstance(value, Integral) and value >= minimum)
    if isinstance(value, bool) or not isinstance(value, Integral) or not in_range or abs(int(value)) >= 2**63:
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{name} must be an integer{bound} (and below 2**63), got {value!r}")


def check_real(name: str, value, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
    """Raise unless `value` is a real number between `low` and `high` (each bound excluded when open)."""
    is_real = isinstance(value, Real) and not isinstance(value, bool)
    above = is_real and (value > low if low_open else value >= low)
    below = is_real and (value < high if high_open else value <= high)
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")


def check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    """Raise unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(choice) for choice in choices)}, got {value!r}")


def perplexity(loss: float) -> float:
    """`exp(loss)`, and `inf` where that is beyond float range (a loss above ~709.78 nats, a diverged run) instead
    of the `OverflowError` `math.exp` raises there: the exact value wherever one exists, as the shipped
    `perplexity_from_nll` metric gives it."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
