"""Static tying strategies: the documented maps, U distinct blocks for every valid U, clear errors."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_layertie.models import STRATEGY_NAMES, TyingMap, check_strategy_spec, parse_strategy, resolve_tying_map

FAST = settings(max_examples=300, deadline=None)


@st.composite
def layers_and_distinct(draw, max_blocks: int = 48) -> tuple[int, int]:
    num_blocks = draw(st.integers(1, max_blocks))
    return num_blocks, draw(st.integers(1, num_blocks))


@pytest.mark.parametrize(
    ("spec", "num_blocks", "expected"),
    [
        ("independent", 4, [0, 1, 2, 3]),
        ("all", 4, [0, 0, 0, 0]),
        # Takase & Kiyono (2021), Figure 1 (6 layers, 3 distinct) and the 12-layer settings.
        ("sequence:3", 6, [0, 0, 2, 2, 4, 4]),
        ("cycle:3", 6, [0, 1, 2, 0, 1, 2]),
        ("cycle_rev:3", 6, [0, 1, 2, 2, 1, 0]),
        ("sequence:2", 6, [0, 0, 0, 3, 3, 3]),
        ("cycle:2", 6, [0, 1, 0, 1, 0, 1]),
        ("cycle_rev:2", 6, [0, 1, 0, 1, 1, 0]),
        ("cycle_rev:3", 9, [0, 1, 2, 0, 1, 2, 2, 1, 0]),
        ("sequence:4", 12, [0, 0, 0, 3, 3, 3, 6, 6, 6, 9, 9, 9]),
        ("cycle_rev:4", 12, [0, 1, 2, 3, 0, 1, 2, 3, 3, 2, 1, 0]),
        # Fewer than two full cycles: the authors' code reverses only the L - U layers after the first cycle.
        ("cycle_rev:3", 4, [0, 1, 2, 2]),
        ("cycle_rev:4", 6, [0, 1, 2, 3, 3, 2]),
        ("cycle_rev:5", 5, [0, 1, 2, 3, 4]),
        ("sandwich", 6, [0, 1, 1, 1, 1, 5]),
        ("sandwich", 2, [0, 1]),
        # The layouts that paid on k-hop induction (depth-fresh, partial-depth).
        ("repeat_one:2", 4, [0, 1, 1, 1]),
        ("repeat_one:3", 5, [0, 1, 1, 1, 4]),
        ("repeat_one:4", 6, [0, 1, 1, 1, 4, 5]),
        ("repeat_one:1", 3, [0, 0, 0]),
        ("repeat_one:4", 4, [0, 1, 2, 3]),
        (" cycle:2 ", 3, [0, 1, 0]),
    ],
)
def test_documented_maps(spec, num_blocks, expected):
    assert parse_strategy(spec, num_blocks).to_list() == expected


@pytest.mark.parametrize("name", ["sequence", "cycle", "cycle_rev", "repeat_one"])
@FAST
@given(layers_and_distinct())
def test_every_valid_distinct_count_gives_exactly_that_many_distinct_blocks(name, sizes):
    num_blocks, distinct = sizes
    tying_map = parse_strategy(f"{name}:{distinct}", num_blocks)

    assert isinstance(tying_map, TyingMap)
    assert len(tying_map) == num_blocks
    assert tying_map.num_distinct == distinct


@FAST
@given(layers_and_distinct())
def test_sequence_uses_each_block_for_a_run_of_consecutive_layers(sizes):
    num_blocks, distinct = sizes
    groups = parse_strategy(f"sequence:{distinct}", num_blocks).groups()

    run_lengths = []
    for root, members in groups.items():
        assert members == list(range(root, root + len(members)))
        run_lengths.append(len(members))
    assert max(run_lengths) - min(run_lengths) <= 1


@FAST
@given(layers_and_distinct())
def test_cycle_visits_the_distinct_blocks_in_turn(sizes):
    num_blocks, distinct = sizes
    tying_map = parse_strategy(f"cycle:{distinct}", num_blocks)

    assert tying_map.to_list() == [block % distinct for block in range(num_blocks)]


@FAST
@given(layers_and_distinct())
def test_cycle_rev_is_cycle_with_the_last_layers_reversed(sizes):
    num_blocks, distinct = sizes
    tying_map = parse_strategy(f"cycle_rev:{distinct}", num_blocks).to_list()
    reversed_blocks = list(reversed(range(distinct)))

    if num_blocks >= 2 * distinct:
        assert tying_map[: num_blocks - distinct] == [block % distinct for block in range(num_blocks - distinct)]
        assert tying_map[num_blocks - distinct :] == reversed_blocks
    else:
        assert tying_map[:distinct] == list(range(distinct))
        assert tying_map[distinct:] == reversed_blocks[: num_blocks - distinct]


@FAST
@given(st.integers(1, 48))
def test_fixed_strategies(num_blocks):
    assert parse_strategy("independent", num_blocks) == TyingMap.independent(num_blocks)
    assert parse_strategy("all", num_blocks).num_distinct == 1
    sandwich = parse_strategy("sandwich", num_blocks)
    if num_blocks >= 3:
        assert sandwich.to_list() == [0] + [1] * (num_blocks - 2) + [num_blocks - 1]
    else:
        assert sandwich == TyingMap.independent(num_blocks)
    if num_blocks >= 3:  # sandwich is the one block repeated between two of their own
        assert parse_strategy("repeat_one:3", num_blocks) == sandwich


def test_every_advertised_strategy_name_parses():
    for name in STRATEGY_NAMES:
        assert parse_strategy(name.replace(":U", ":2"), 6).num_distinct >= 1


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("cycle", "tying strategy 'cycle' needs the number of distinct blocks as 'cycle:U' with U a positive integer"),
        ("cycle:", "needs the number of distinct blocks as 'cycle:U'"),
        ("cycle:x", "with U a positive integer, got 'cycle:x'"),
        ("cycle:-1", "with U a positive integer, got 'cycle:-1'"),
        ("cycle:²", "with U a positive integer, got 'cycle:²'"),
        ("cycle:0", "'cycle:U' with U a positive integer, got 'cycle:0'"),
        ("sequence:7", "'sequence:7': U = 7 distinct blocks exceeds the 6 blocks of the model"),
        ("cycle_rev:99", "'cycle_rev:99': U = 99 distinct blocks exceeds the 6 blocks of the model"),
        ("all:3", "tying strategy 'all' takes no ':U' argument, got 'all:3'"),
        ("all:", "tying strategy 'all' takes no ':U' argument, got 'all:'"),
        ("bogus", "unknown tying strategy 'bogus' in 'bogus'; expected one of independent, all, sandwich, sequence:U"),
        ("", "tying strategy must be a non-empty string"),
        ("   ", "tying strategy must be a non-empty string"),
    ],
)
def test_bad_spec_gets_a_clear_error(spec, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        parse_strategy(spec, 6)


def test_non_string_spec_is_rejected():
    with pytest.raises(ValueError, match="tying strategy must be a non-empty string"):
        parse_strategy(3, 6)


def test_model_without_blocks_is_rejected():
    with pytest.raises(ValueError, match="num_blocks must be at least 1, got 0"):
        parse_strategy("all", 0)


@pytest.mark.parametrize(("spec", "expected"), [("cycle:4", ("cycle", 4)), ("all", ("all", None))])
def test_spec_syntax_is_checked_without_a_model(spec, expected):
    assert check_strategy_spec(spec) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0 0 2 2", [0, 0, 2, 2]), ("0,0,1,2", [0, 0, 0, 0]), ("cycle:2", [0, 1, 0, 1]), ("all", [0, 0, 0, 0])],
)
def test_resolve_tying_map_takes_explicit_entries_or_a_strategy(text, expected):
    assert resolve_tying_map(text, 4).to_list() == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0 0 5 2", "tying_map[2] = 5 is a forward reference"),
        ("0 -1 1 2", "tying_map[1] = -1 is negative"),
        ("0 0 1", "tying_map has 3 entries but the model has 4 blocks"),
        ("0 0 ² 1", "tying map '0 0 ² 1': entry 2 ('²') is not an integer in ASCII digits"),
        ("0 --1 1 2", "entry 1 ('--1') is not an integer"),
        ("0 0 ２ 1", "entry 2 ('２') is not an integer in ASCII digits"),  # a full-width digit: ASCII entries only
        ("0,,1,1", "tying map '0,,1,1': entry 1 is empty"),  # not the map 0 1 1 of a 3-block model
        ("0,1,1,", "entry 3 is empty"),
        ("0,1,x,2", "entry 2 ('x') is not an integer"),
        ("cycle:２", "'cycle:U' with U a positive integer"),  # other scripts' digits, which int() reads, refused too
        ("sequence:٣", "'sequence:U' with U a positive integer"),
    ],
)
def test_resolve_tying_map_reports_bad_entries(text, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        resolve_tying_map(text, 4)
