"""The config side of tying: `tying_map` and `tie_init`, validated, and owned by the model built on the config.

Every tied config (`TiedGPT2Config`, `TiedLlamaConfig`, ...) mixes in `TyingConfigMixin`, which declares the two
fields once for all of them. Like the other files of this folder it only uses relative imports: it is copied next to checkpoints.
It imports `_compat` so that a config loaded alone (`AutoConfig` with `trust_remote_code=True`) brings that file along
and checks the transformers it runs under, as the models do.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import weakref

from transformers.utils import logging

from ._compat import SUPPORTED_TRANSFORMERS  # noqa: F401 (importing it checks the installed transformers)
from .tying_map import TyingMap

logger = logging.get_logger(__name__)

TIE_INITS = ("root", "mean")
# The loop recipe's settings, which no plain transformers class computes (`to_untied()` refuses them).
LOOP_RECIPE_FIELDS = ("loop_residual_scale", "loop_input_injection")
# Fields a tied config adds to its transformers config; `to_untied()` leaves them out.
TYING_FIELDS = ("tying_map", "tie_init", "skipped_positions", *LOOP_RECIPE_FIELDS)


def check_tie_init(value) -> None:
    if value not in TIE_INITS:
        raise ValueError(f"tie_init must be one of {TIE_INITS}, got {value!r}")


def check_skipped_positions(value, num_blocks: int | None = None, name: str = "skipped_positions") -> list[int] | None:
    """`value` as a config holds it: the distinct positions, sorted, or None for none. Refuses, naming `name` and
    the entry, anything but block positions (`0 <= p < num_blocks` when the depth is known) that leave one active."""
    if value is None:
        return None
    entries = list(value)
    for index, position in enumerate(entries):
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"{name}[{index}] must be a block position (an integer >= 0), got {position!r}")
        if num_blocks is not None and position >= num_blocks:
            raise ValueError(f"{name}[{index}] = {position} is not a position of this {num_blocks}-block model (0 to {num_blocks - 1})")
    if len(set(entries)) != len(entries):
        raise ValueError(f"{name} names a position twice: {entries}")
    if num_blocks is not None and len(entries) >= num_blocks:
        raise ValueError(f"{name} {entries} skips every one of the {num_blocks} positions: at least one must compute")
    return sorted(entries) or None


@dataclasses.dataclass(init=False, repr=False, eq=False)
class TyingConfigMixin:
    r"""The two fields every tied config declares, validated.

    tying_map (`list[int]`, *optional*):
        `tying_map[i] = j` makes block `i` use block `j`'s weights (`j <= i`; `j == i`: independent; block 0 is
        always independent). Stored in canonical form (chains resolved to the block that owns the weights).
        `None` means every block is independent, and stays `None` so that changing the number of layers
        (e.g. with `--config_overrides`) needs no second edit. Invalid maps raise `ValueError` naming the
        index, the value and the rule broken. Once a model is built on the config, assigning the map raises:
        it must change together with the model's Parameters, through `model.retie(...)`, which also tells an
        optimizer or DDP wrapper what changed.
    skipped_positions (`list[int]`, *optional*):
        Block positions the model does not compute: each is the identity (its hidden states pass through unchanged,
        no block call, no KV-cache entry), so the model computes as the shorter model holding only the other
        positions, in order, would. Depth chosen per run: set it in the config (saved and reloaded, remote code
        too), or per call with `model(..., skipped_positions=[...])` / `generate(..., skipped_positions=[...])`
        (`[]` computes every position). For a looped map (`cycle:U` over L = nU blocks) skipping the last kU
        positions runs n - k loops. The map and the weights are untouched; `to_untied()` exports the positions
        computed. `None` (the default) computes every position.
    loop_residual_scale (`bool`, *optional*, defaults to `False`):
        Scale each block's update (its output minus its input) by 1/N, N the number of computed positions that use
        its weights, so a block repeated N times adds as much as one used once (the residual scaling of 2026 looped
        models, 2606.18524, whose point is that the best learning rate then depends on the unique blocks only).
    loop_input_injection (`bool`, *optional*, defaults to `False`):
        Add the token embeddings to the input of every repeated position (one whose weights an earlier computed
        position used already), as Huginn (Geiping et al., 2025) and Ouro feed the input to each loop.
    tie_init (`str`, *optional*, defaults to `"root"`):
        The weights a tie group starts from when `from_pretrained(path, tying_map=...)` (or a `config=` with
        another map) groups a checkpoint's blocks differently from how they were saved (a plain checkpoint
        converted, a tied one re-grouped): `"root"`, the weights its first block used in the checkpoint;
        `"mean"`, the average over its blocks of the weights each used (how relaxed recursive transformers
        initialise shared layers; weights the checkpoint's blocks shared count once per block), as `retie` does.
        Blocks the checkpoint has no weights for are left out of the average. It applies to the load it is passed to: a
        checkpoint saved by a model converted with `"mean"` keeps the value in its config.json, and a later
        `from_pretrained(path, tying_map=...)` without `tie_init` groups with `"root"`. `retie` takes the same
        choice as an argument (`"root"` unless told).
    """

    # Kept out of `__dict__`, hence out of `to_dict()`, config.json and `==`:
    # - `_tied_model`: a weak reference to the model built on this config. Copies and pickles leave it out
    #   (`__getstate__`): a copied config drives no model yet (a copied model binds its own copy again).
    # - `_saved_tying_map`: the map a checkpoint's weights were saved with, when `from_pretrained(path,
    #   tying_map=...)` asks for another; the model built on the config takes it to group the loaded weights.
    __slots__ = ("_tied_model", "_saved_tying_map")

    # Dataclass fields, so that every tied config (a dataclass, as transformers' configs are) inherits them.
    tying_map: list | None = None
    tie_init: str = "root"
    skipped_positions: list | None = None
    loop_residual_scale: bool = False
    loop_input_injection: bool = False

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.tying_map is not None:
            self.tying_map = TyingMap(self.tying_map, num_blocks=self.num_hidden_layers).to_list()
        check_tie_init(self.tie_init)
        self.skipped_positions = check_skipped_positions(self.skipped_positions, self.num_hidden_layers)

    def __setattr__(self, key, value):
        # Maps set on a built config (`from_pretrained(path, tying_map=...)` assigns its kwargs that way) are
        # validated and made canonical too; the length is checked when a model applies them.
        if key == "tying_map":
            self._refuse_if_bound()
            if value is not None:
                value = TyingMap(value).to_list()
        elif key == "tie_init":
            check_tie_init(value)
        elif key == "skipped_positions":
            value = check_skipped_positions(value, getattr(self, "num_hidden_layers", None))
        super().__setattr__(key, value)

    def update_from_string(self, update_str: str):
        if "tying_map" in (item.split("=")[0].strip() for item in update_str.split(",")):
            self._refuse_if_bound()
            raise ValueError(
                "tying_map cannot be given among key=value overrides (its entries would be split at the commas): "
                "pass tying_map=[...] to the config or to from_pretrained, or the map as a strategy "
                "(tying_strategy='static:0,0,2,2')"
            )
        super().update_from_string(update_str)

    def __getstate__(self):
        saved = getattr(self, "_saved_tying_map", None)
        return (dict(self.__dict__), {"_saved_tying_map": saved}) if saved is not None else dict(self.__dict__)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        loaded = super().from_dict(config_dict, **kwargs)
        if "tying_map" in kwargs:  # a checkpoint loaded with another map
            config = loaded[0] if kwargs.get("return_unused_kwargs") else loaded
            saved = cls._map_saved_in(config_dict, config.num_hidden_layers)
            config._regroup_from(saved, tie_init_asked="tie_init" in kwargs)
        return loaded

    def for_checkpoint(self, checkpoint, **download_kwargs):
        """This config as `from_pretrained(checkpoint, config=self)` should load with it: when its map differs from
        the one the checkpoint's weights were saved with (read from its config.json), a copy that remembers the
        saved map, so that blocks stored as ties get their weights as with `from_pretrained(..., tying_map=...)`,
        and groups with `tie_init="root"` as that does, unless this config's `tie_init` differs from the
        checkpoint's. `self` when the maps agree, or when the checkpoint has no config.json or none that says a
        valid map (its weights are taken as this config's map says: `config=` is how a bad config.json is bypassed)."""
        try:
            saved_dict, _ = self.get_config_dict(checkpoint, **download_kwargs)
            saved = self._map_saved_in(saved_dict, self.num_hidden_layers)
        except (OSError, ValueError):
            return self
        if saved == self.tying:
            return self
        # A config that `from_pretrained(checkpoint, tying_map=...)` prepared already kept its `tie_init` or not.
        prepared = getattr(self, "_saved_tying_map", None) is not None
        config = copy.deepcopy(self)
        config._regroup_from(saved, tie_init_asked=prepared or self.tie_init != saved_dict.get("tie_init", "root"))
        return config

    def _regroup_from(self, saved: TyingMap, tie_init_asked: bool) -> None:
        """Prepare this config to load a checkpoint whose weights were saved with the map `saved`: the model built
        on it groups them (`_saved_tying_map`), from each group's root unless this load asked for a `tie_init` (a
        value kept in the checkpoint's config.json said how that checkpoint's own load grouped, not this one)."""
        self._saved_tying_map = saved
        if not tie_init_asked:
            if self.tie_init != "root":  # a user who set the saved value again cannot be told apart: say what happens
                logger.warning(
                    f"tie_init={self.tie_init!r} is the value the checkpoint was saved with (how its own groups were "
                    f"built): its blocks are regrouped from each group's root. To regroup them with {self.tie_init!r}, load "
                    f"with from_pretrained(checkpoint, tying_map=..., tie_init={self.tie_init!r})"
                )
            self.tie_init = "root"

    @classmethod
    def _map_saved_in(cls, config_dict: dict, num_layers: int) -> TyingMap:
        """The map a checkpoint's weights were saved with, from its config.json's dict: its `tying_map`, else every
        block its own (a plain checkpoint's; `num_layers` blocks when the dict does not say how many)."""
        saved = config_dict.get("tying_map")
        if saved is None:
            saved = range(config_dict.get(cls.attribute_map.get("num_hidden_layers", "num_hidden_layers"), num_layers))
        return TyingMap(saved)

    @property
    def tying(self) -> TyingMap:
        """The map as a `TyingMap` (independent blocks when `tying_map` is `None`)."""
        if self.tying_map is None:
            return TyingMap.independent(self.num_hidden_layers)
        return TyingMap(self.tying_map, num_blocks=self.num_hidden_layers)

    def _bind(self, model) -> None:
        """Called by the model built on this config: from now on only `model.retie` changes the map. Never a
        second model: one built on a config that drives another gets a copy of it (`TiedBlocksMixin.__init__`)."""
        self._tied_model = weakref.ref(model)

    def _live_bound_model(self):
        """The model this config drives, if it is still in use: one that is not may still wait for the garbage
        collector (held in a reference cycle, such as an exception's traceback), and does not count."""
        if self._bound_model() is not None:
            gc.collect()
        return self._bound_model()

    def _take_saved_tying_map(self) -> TyingMap | None:
        saved = getattr(self, "_saved_tying_map", None)
        self._saved_tying_map = None
        return saved

    def _set_tying_map_of_model(self, tying_map: TyingMap) -> None:
        """`retie`'s way to record the map it applied (assignment is refused once a model is bound)."""
        super().__setattr__("tying_map", tying_map.to_list())

    def _bound_model(self):
        reference = getattr(self, "_tied_model", None)
        return reference() if reference is not None else None

    def _refuse_if_bound(self) -> None:
        model = self._live_bound_model()
        if model is not None:
            raise ValueError(
                f"config.tying_map cannot be assigned once a {type(model).__name__} is built on the config: "
                f"the blocks would not follow. Call model.retie(new_map) instead"
            )
