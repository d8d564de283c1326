"""Static tying strategies: fixed maps used as baselines and as starting points for DLT.

Spec strings (`parse_strategy("cycle:4", num_blocks=12)`):

- `independent`: every block owns its weights (conventional training).
- `all`: every block uses block 0 (ALBERT, Universal Transformer).
- `sequence:U`: U distinct blocks, each used by a run of consecutive positions
  (`0 0 0 3 3 3 ...`; Takase & Kiyono, 2021).
- `cycle:U`: U distinct blocks used in turn (`0 1 2 0 1 2 ...`; Takase & Kiyono).
- `cycle_rev:U`: like `cycle`, the last cycle visited in reverse (`0 1 2 0 1 2 2 1 0`; Takase & Kiyono).
- `sandwich`: first and last blocks independent, every middle block shares block 1 (Subformer;
  Reid et al., 2021).
- `repeat_one:U`: U distinct blocks, block 0 alone, then block 1 repeated, then the last U - 2 alone (`0 1 1 1` at
  U = 2 over 4 positions, `0 1 1 1 4` at U = 3 over 5, which is `sandwich`). The layout that paid at equal
  training memory on k-hop induction, on seeds kept out of every choice: `0 1 1 1` scored above 2 untied blocks
  on each of 10 (`--preset depth-fresh`), `0 1 1 1 4` above 3 untied blocks on each of 5 (`--preset
  partial-depth`), where looping block 0 instead cost and loops over 6 positions sank on some seeds
  (`bench/README.md`, "A recipe that trains tied models reliably" and "Mild loops at equal parameters"). A step
  computes every position it does not skip (`config.skipped_positions`): the saving is memory, not time. In
  language modeling, loops came out below U untied blocks only under the 2026 loop recipe and at equal steps; given
  a loop's block calls as more steps, U untied blocks came out below it (`bench/README.md`, "The loop recipe").
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .tying_map import TyingMap


def _independent(num_blocks: int) -> list[int]:
    return list(range(num_blocks))


def _all(num_blocks: int) -> list[int]:
    return [0] * num_blocks


def _sequence(num_blocks: int, distinct: int) -> list[int]:
    # Position i belongs to run floor(i * U / L); each run uses its first position's weights.
    runs = [index * distinct // num_blocks for index in range(num_blocks)]
    first_of_run = {run: runs.index(run) for run in set(runs)}
    return [first_of_run[run] for run in runs]


def _cycle(num_blocks: int, distinct: int) -> list[int]:
    return [index % distinct for index in range(num_blocks)]


def _cycle_rev(num_blocks: int, distinct: int) -> list[int]:
    # Takase & Kiyono's CYCLE (REV), as in their code: cycle over the first max(L - U, U) positions, then
    # the remaining positions (the last U when L >= 2U) visit the distinct blocks in reverse order.
    head = [index % distinct for index in range(max(num_blocks - distinct, distinct))]
    return head + list(reversed(range(distinct)))[: num_blocks - len(head)]


def _repeat_one(num_blocks: int, distinct: int) -> list[int]:
    if distinct == 1:
        return [0] * num_blocks
    own = list(range(num_blocks - (distinct - 2), num_blocks))  # the last U - 2 positions keep their weights
    return [0] + [1] * (num_blocks - 1 - len(own)) + own


def _sandwich(num_blocks: int) -> list[int]:
    if num_blocks < 3:
        return list(range(num_blocks))
    return [0] + [1] * (num_blocks - 2) + [num_blocks - 1]


_FIXED: dict[str, Callable[[int], list[int]]] = {"independent": _independent, "all": _all, "sandwich": _sandwich}
_WITH_DISTINCT: dict[str, Callable[[int, int], list[int]]] = {
    "sequence": _sequence,
    "cycle": _cycle,
    "cycle_rev": _cycle_rev,
    "repeat_one": _repeat_one,
}
STRATEGY_NAMES: tuple[str, ...] = tuple(_FIXED) + tuple(f"{name}:U" for name in _WITH_DISTINCT)


def positive_integer(text: str) -> int | None:
    """`text` as a positive integer written in ASCII digits (the U of `cycle:U`), else None: other scripts' digits,
    which `int` reads too, would give a run's name and card a U other tools cannot parse."""
    return int(text) if re.fullmatch(r"\d+", text, flags=re.ASCII) and int(text) >= 1 else None


def check_strategy_spec(spec: str) -> tuple[str, int | None]:
    """Validate a spec's syntax without knowing the model; returns `(name, U or None)`."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"tying strategy must be a non-empty string, one of {', '.join(STRATEGY_NAMES)}; got {spec!r}")
    name, separator, argument = spec.strip().partition(":")
    if name in _FIXED:
        if separator:
            raise ValueError(f"tying strategy {name!r} takes no ':U' argument, got {spec!r}")
        return name, None
    if name not in _WITH_DISTINCT:
        raise ValueError(f"unknown tying strategy {name!r} in {spec!r}; expected one of {', '.join(STRATEGY_NAMES)}")
    distinct = positive_integer(argument)
    if distinct is None:
        raise ValueError(
            f"tying strategy {name!r} needs the number of distinct blocks as '{name}:U' with U a positive "
            f"integer, got {spec!r}"
        )
    return name, distinct


def parse_strategy(spec: str, num_blocks: int) -> TyingMap:
    """Build the map of a static strategy from its spec string (see the module docstring)."""
    name, distinct = check_strategy_spec(spec)
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
    if distinct is None:
        return TyingMap(_FIXED[name](num_blocks))
    if distinct > num_blocks:
        raise ValueError(f"{spec!r}: U = {distinct} distinct blocks exceeds the {num_blocks} blocks of the model")
    return TyingMap(_WITH_DISTINCT[name](num_blocks, distinct))


def _explicit_entries(text: str) -> list[int] | None:
    """`"0 0 2 2"` or `"0,0,2,2"` as integers; None when `text` names a strategy (it starts with a letter). Entries
    separated by commas are each checked, so that a typo such as `"0,,1,1"` is not read as the map `0 1 1`."""
    text = text.strip()
    if not text or text[0].isalpha() or text[0] == "_":
        return None
    fields = re.split(r"\s*,\s*|\s+", text)  # commas, spaces or both; an empty field is two commas in a row
    for position, field in enumerate(fields):
        if not re.fullmatch(r"-?\d+", field, flags=re.ASCII):
            problem = "is empty" if not field else f"({field!r}) is not an integer in ASCII digits"
            raise ValueError(f"tying map {text!r}: entry {position} {problem}")
    return [int(field) for field in fields]


def check_static_spec(text: str) -> None:
    """Validate, without knowing the model, a map given as a strategy spec or as explicit entries."""
    if not isinstance(text, str):
        raise ValueError(f"a tying map must be given as a string (a strategy spec or entries), got {text!r}")
    entries = _explicit_entries(text)
    if entries is not None:
        TyingMap(entries)
    else:
        check_strategy_spec(text)


def resolve_tying_map(text: str, num_blocks: int) -> TyingMap:
    """A map from either a strategy spec (`"cycle:4"`) or explicit entries (`"0 0 2 2"` or `"0,0,2,2"`)."""
    entries = _explicit_entries(text)
    if entries is not None:
        return TyingMap(entries, num_blocks=num_blocks)
    return parse_strategy(text, num_blocks)
