"""TyingMap: validation with errors that point at the culprit, canonical form, and map algebra."""

import re

import pytest
from helpers.models import raw_tying_maps
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_layertie import TyingMap

FAST = settings(max_examples=200, deadline=None)


def follow_chain(entries: list[int], block: int) -> int:
    """The block that owns `block`'s weights, found by walking the raw map until a fixed point."""
    while entries[block] != block:
        block = entries[block]
    return block


@FAST
@given(raw_tying_maps(min_blocks=1, max_blocks=16))
def test_canonical_form_points_every_block_at_the_owner_of_its_weights(entries):
    tying_map = TyingMap(entries)

    assert len(tying_map) == len(entries)
    assert list(tying_map) == [follow_chain(entries, block) for block in range(len(entries))]
    for block, root in enumerate(tying_map):
        assert root <= block
        assert tying_map.is_independent(root)


@FAST
@given(raw_tying_maps(min_blocks=1, max_blocks=16))
def test_canonicalization_is_idempotent_and_equal_maps_hash_equal(entries):
    tying_map = TyingMap(entries)
    again = TyingMap(tying_map.to_list(), num_blocks=len(entries))

    assert again == tying_map
    assert again.entries == tying_map.entries
    assert hash(again) == hash(tying_map)
    assert TyingMap(tying_map) == tying_map


def test_chains_resolve_to_their_root():
    assert TyingMap([0, 0, 1, 2, 4, 4]).to_list() == [0, 0, 0, 0, 4, 4]
    assert TyingMap([0, 1, 1, 2]) == TyingMap([0, 1, 1, 1])


def test_a_map_equals_the_list_of_its_canonical_entries():
    """`model.tying_map == [0, 0, 2, 2]`, as the docs write maps, is what it reads as; equality stays consistent
    with hashing (a map and the tuple of its entries are one key) and transitive."""
    assert TyingMap([0, 0, 2, 2]) == [0, 0, 2, 2] and [0, 0, 2, 2] == TyingMap([0, 0, 2, 2])
    assert TyingMap([0, 1, 1, 2]) == (0, 1, 1, 1) and (0, 1, 1, 1) in {TyingMap([0, 1, 1, 2])}
    assert TyingMap([0, 1, 1, 2]) != [0, 1, 1, 2]  # not canonical: the map holds 0 1 1 1
    assert TyingMap([0, 0, 2, 2]) != [0, 0, 0, 2] and TyingMap([0, 0]) != [1, 0]  # another map; no map at all
    assert TyingMap([0, 0]) != "0 0"


@FAST
@given(raw_tying_maps(min_blocks=1, max_blocks=16))
def test_groups_partition_the_blocks_by_owner(entries):
    tying_map = TyingMap(entries)
    groups = tying_map.groups()

    assert list(groups) == tying_map.independent_blocks
    assert sorted(block for members in groups.values() for block in members) == list(range(len(entries)))
    for root, members in groups.items():
        assert members[0] == root
        assert members == sorted(members)
        assert all(tying_map[block] == root for block in members)
    assert tying_map.num_distinct == len(groups) == len(set(tying_map))


@FAST
@given(raw_tying_maps(min_blocks=1, max_blocks=16))
def test_render_lists_one_owner_per_block(entries):
    tying_map = TyingMap(entries)

    assert [int(token) for token in tying_map.render().split(" ")] == tying_map.to_list()
    assert tying_map.render() in repr(tying_map)


def test_independent_map():
    assert TyingMap.independent(5).to_list() == [0, 1, 2, 3, 4]
    assert TyingMap.independent(5).num_distinct == 5
    with pytest.raises(ValueError, match="num_blocks must be at least 1, got 0"):
        TyingMap.independent(0)


@st.composite
def decisions(draw):
    """A map and one DLT decision on it: block > 0 takes the weights of a source <= block."""
    tying_map = TyingMap(draw(raw_tying_maps(min_blocks=2, max_blocks=12)))
    block = draw(st.integers(1, len(tying_map) - 1))
    source = draw(st.integers(0, block))
    return tying_map, block, source


@FAST
@given(decisions())
def test_a_decision_changes_the_weights_of_the_deciding_block_only(decision):
    tying_map, block, source = decision
    new_map = tying_map.with_decision(block, source)

    assert new_map[block] == (block if source == block else tying_map[source])
    # Every other block computes with the same weights as before: blocks that used `block`'s weights keep
    # them, under the smallest of them as their new owner.
    for group in tying_map.groups().values():
        rest = [other for other in group if other != block]
        assert len({new_map[other] for other in rest}) <= 1
        if rest and block not in group:
            assert new_map[rest[0]] == tying_map[rest[0]]
    assert abs(new_map.num_distinct - tying_map.num_distinct) <= 1
    assert tying_map.with_decision(block, source) == new_map  # the original is unchanged (frozen)


def test_with_decision_examples():
    tying_map = TyingMap([0, 1, 1, 3])
    assert tying_map.with_decision(1, 0).to_list() == [0, 0, 2, 3]  # block 2 keeps block 1's weights, as owner
    assert tying_map.with_decision(1, 1) == tying_map  # staying independent changes nothing
    assert tying_map.with_decision(2, 2).to_list() == [0, 1, 2, 3]  # untie
    assert tying_map.with_decision(3, 2).to_list() == [0, 1, 1, 1]  # tied to a tied block: resolved
    assert TyingMap([0, 1, 1, 1, 4]).with_decision(1, 0).to_list() == [0, 0, 2, 2, 4]


@FAST
@given(decisions())
def test_decision_options_are_distinct_and_reach_every_reachable_map(decision):
    tying_map, block, _ = decision
    options = tying_map.decision_options(block)

    reachable = {tying_map.with_decision(block, source) for source in range(block + 1)}
    assert options[0] == block
    assert len({tying_map.with_decision(block, source) for source in options}) == len(options)
    assert {tying_map.with_decision(block, source) for source in options} == reachable


@pytest.mark.parametrize("block", [0, 4])
def test_decision_options_name_the_blocks_that_decide(block):
    with pytest.raises(ValueError, match=rf"block must be in 1..3 \(block 0 is always independent\), got {block}"):
        TyingMap.independent(4).decision_options(block)


@pytest.mark.parametrize("block", [-1, 4, 10])
def test_with_decision_rejects_a_block_out_of_range(block):
    with pytest.raises(ValueError, match=rf"block {block} is out of range for a map of 4 blocks"):
        TyingMap.independent(4).with_decision(block, 0)


def test_with_decision_rejects_a_later_source():
    with pytest.raises(ValueError, match=re.escape("tying_map[1] = 3 is a forward reference")):
        TyingMap.independent(4).with_decision(1, 3)


# --- invalid maps: the error names the index, the value and the rule -------------------------------


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([0, 0, 1], "tying_map has 3 entries but the model has 4 blocks"),
        ([0, 0, 1, 2, 3], "tying_map has 5 entries but the model has 4 blocks"),
        ([0, True, 1, 2], "tying_map[1] = True is not an integer block index"),
        ([0, 0, 1.0, 2], "tying_map[2] = 1.0 is not an integer block index"),
        ([0, 0, 1, "2"], "tying_map[3] = '2' is not an integer block index"),
        ([0, None, 1, 2], "tying_map[1] = None is not an integer block index"),
        ([0, 0, -1, 2], "tying_map[2] = -1 is negative; block indices start at 0"),
        ([0, 0, 3, 2], "tying_map[2] = 3 is a forward reference"),
        ([1, 0, 1, 2], "tying_map[0] = 1: block 0 is always independent"),
    ],
)
def test_invalid_map_error_names_index_value_and_rule(entries, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        TyingMap(entries, num_blocks=4)


@pytest.mark.parametrize("entries", ["0 0 1", b"\x00", 3, None])
def test_map_that_is_not_a_sequence_of_indices_is_rejected(entries):
    with pytest.raises(ValueError, match="tying_map must be a sequence of block indices, got"):
        TyingMap(entries)


@pytest.mark.parametrize("entries", [{0: 0, 1: 0, 2: 0, 3: 0}, {0, 1}, frozenset({0})])
def test_a_dict_or_set_is_rejected_rather_than_read_by_its_keys_or_in_no_order(entries):
    # list({0: 0, 1: 0, 2: 0, 3: 0}) is [0, 1, 2, 3]: without the check this dict would untie every block.
    with pytest.raises(ValueError, match=r"tying_map must be a sequence with entry i for block i, got a (dict|set|frozenset)"):
        TyingMap(entries)


def test_empty_map_is_rejected():
    with pytest.raises(ValueError, match="tying_map must have one entry per block, got an empty sequence"):
        TyingMap([])


# rule (as worded in the error) -> values that break it at a given index
_BAD_VALUES = {
    "not an integer block index": lambda index: st.one_of(st.booleans(), st.floats(), st.text(max_size=3)),
    "is negative": lambda index: st.integers(max_value=-1),
    "is a forward reference": lambda index: st.integers(index + 1, index + 100),
}


@FAST
@given(entries=raw_tying_maps(min_blocks=2, max_blocks=12), data=st.data())
def test_first_invalid_entry_is_reported_whatever_follows(entries, data):
    index = data.draw(st.integers(1, len(entries) - 1), label="index")
    rule = data.draw(st.sampled_from(sorted(_BAD_VALUES)), label="rule")
    value = data.draw(_BAD_VALUES[rule](index), label="value")
    tail_length = len(entries) - 1 - index
    tail = data.draw(st.lists(st.integers(-3, 30), min_size=tail_length, max_size=tail_length), label="tail")
    corrupted = [*entries[:index], value, *tail]

    with pytest.raises(ValueError) as error:
        TyingMap(corrupted, num_blocks=len(entries))

    assert str(error.value).startswith(f"tying_map[{index}] = {value!r}")
    assert rule in str(error.value)


@FAST
@given(value=st.integers(1, 50))
def test_block_zero_must_be_independent(value):
    with pytest.raises(ValueError, match=re.escape(f"tying_map[0] = {value}: block 0 is always independent")):
        TyingMap([value, 0, 0])
