"""The tying map: which transformer block uses which block's weights.

`tying_map[i] = j` means block `i` computes with block `j`'s weights. `j == i` means block `i`
is independent (owns its weights); `j < i` means block `i` is tied to block `j`. Block 0 is always
independent. Maps are kept in canonical form, where every entry points at an independent block,
so that "which Parameters does block i use" is one look-up and two maps that share weights the
same way compare equal.

This file only depends on the standard library: it is copied next to saved checkpoints so that
they load with `trust_remote_code=True` in environments without `hf_layertie`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from numbers import Integral
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: a map needs no torch
    from torch import nn


def _validate_entries(entries: Sequence, num_blocks: int | None) -> list[int]:
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Iterable):
        raise ValueError(f"tying_map must be a sequence of block indices, got {type(entries).__name__}: {entries!r}")
    if isinstance(entries, (Mapping, Set)):
        # Iterating a dict gives its keys, a set has no order: either would silently build another map.
        raise ValueError(
            f"tying_map must be a sequence with entry i for block i, got a {type(entries).__name__}: {entries!r}; "
            f"for a dict {{block: source}} pass [mapping[block] for block in range(num_blocks)]"
        )
    entries = list(entries)
    if not entries:
        raise ValueError("tying_map must have one entry per block, got an empty sequence")
    if num_blocks is not None and len(entries) != num_blocks:
        raise ValueError(
            f"tying_map has {len(entries)} entries but the model has {num_blocks} blocks; "
            f"expected exactly one entry per block"
        )
    for index, value in enumerate(entries):
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise ValueError(f"tying_map[{index}] = {value!r} is not an integer block index")
        if value < 0:
            raise ValueError(f"tying_map[{index}] = {value} is negative; block indices start at 0")
        if value > index:
            if index == 0:
                raise ValueError(f"tying_map[0] = {value}: block 0 is always independent, its entry must be 0")
            raise ValueError(
                f"tying_map[{index}] = {value} is a forward reference: block {index} may only use its own "
                f"weights ({index}) or those of an earlier block (0..{index - 1})"
            )
    return [int(value) for value in entries]


def _canonicalize(entries: list[int]) -> tuple[int, ...]:
    """Resolve chains (3 -> 2 -> 0 becomes 3 -> 0). Entries only point backwards, so one pass suffices."""
    roots: list[int] = []
    for index, value in enumerate(entries):
        roots.append(index if value == index else roots[value])
    return tuple(roots)


@dataclass(frozen=True)
class TyingMap(Sequence):
    """A validated, canonical tying map.

    Args:
        entries: `entries[i]` is the block whose weights block `i` uses (`i` itself for independent).
            Chains are resolved to their root.
        num_blocks: if given, the number of blocks the map must cover.

    Raises:
        ValueError: naming the index, the value and the rule broken (length, integer, sign, order).
    """

    entries: tuple[int, ...]

    def __init__(self, entries: Iterable[int], num_blocks: int | None = None):
        object.__setattr__(self, "entries", _canonicalize(_validate_entries(entries, num_blocks)))

    @classmethod
    def independent(cls, num_blocks: int) -> TyingMap:
        """The map of a conventional transformer: every block owns its weights."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        return cls(range(num_blocks))

    def __eq__(self, other) -> bool:
        """Equal to a map sharing weights the same way, and to a list or tuple of its canonical entries
        (`model.tying_map == [0, 0, 2, 2]`); as a tuple of them hashes alike, a map and its tuple are one key."""
        if isinstance(other, TyingMap):
            return self.entries == other.entries
        if isinstance(other, (list, tuple)):
            return self.entries == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.entries)

    def __getitem__(self, index):
        return self.entries[index]

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"TyingMap({self.render()})"

    def occurrences(self) -> list[int]:
        """For each position, how many earlier positions use the same weights (0: the weights' first use; above 0:
        a repeated position of a looped model)."""
        seen: dict[int, int] = {}
        counts = []
        for root in self.entries:
            counts.append(seen.get(root, 0))
            seen[root] = counts[-1] + 1
        return counts

    @property
    def num_distinct(self) -> int:
        """Number of blocks that own weights: the number of trainable block copies."""
        return len(self.independent_blocks)

    @property
    def independent_blocks(self) -> list[int]:
        return [index for index, root in enumerate(self.entries) if root == index]

    def is_independent(self, block: int) -> bool:
        return self.entries[block] == block

    def groups(self) -> dict[int, list[int]]:
        """Blocks grouped by the block whose weights they use: `{root: [root, tied, ...]}`."""
        groups: dict[int, list[int]] = {}
        for index, root in enumerate(self.entries):
            groups.setdefault(root, []).append(index)
        return groups

    def with_decision(self, block: int, source: int) -> TyingMap:
        """The map after tying `block` to `source` (or untying it when `source == block`).

        Only `block` changes what it computes with: a tied `source` resolves to its root, and when
        `block` owned weights that other blocks used, those blocks keep them, the smallest of them
        becoming their owner. (Moving a whole group with one decision would let a single action
        change many blocks at once, which neither the agent's credit assignment nor a budget on
        distinct blocks can reason about.)
        """
        if not 0 <= block < len(self):
            raise ValueError(f"block {block} is out of range for a map of {len(self)} blocks")
        entries = list(self.entries)
        if source != block:
            followers = [other for other in range(block + 1, len(self)) if entries[other] == block]
            for other in followers:
                entries[other] = followers[0]
        entries[block] = source
        return TyingMap(entries)

    def decision_options(self, block: int) -> list[int]:
        """The distinct choices of `block`: stay (or become) independent, or use an earlier block that owns weights.

        Tying to a tied block means tying to its root, so only roots are offered: every option leads to a
        different map.
        """
        if not 1 <= block < len(self):
            raise ValueError(f"block must be in 1..{len(self) - 1} (block 0 is always independent), got {block}")
        return [block] + [root for root in self.independent_blocks if root < block]

    def render(self) -> str:
        """One line, one number per block, e.g. `0 0 0 3 3 5`."""
        return " ".join(str(root) for root in self.entries)

    def to_list(self) -> list[int]:
        return list(self.entries)


@dataclass
class RetieReport:
    """What `TiedBlocksMixin.retie` changed: the Parameters `added` and `removed`, and where the added ones come from,
    which `sync_optimizer_with_model` reads to bring an optimizer along.

    `copied_from[new]` is the Parameter a fresh Parameter was copied from, so that optimizer state and
    parameter groups can follow the weights; `averaged_from[new]` the Parameters a fresh one is the mean of
    (`tie_init="mean"`). Parameters that only moved to another block are in none of these.
    """

    old_map: TyingMap
    new_map: TyingMap
    added: list[nn.Parameter] = field(default_factory=list)
    removed: list[nn.Parameter] = field(default_factory=list)
    copied_from: dict[nn.Parameter, nn.Parameter] = field(default_factory=dict)
    averaged_from: dict[nn.Parameter, list[nn.Parameter]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.old_map != self.new_map
