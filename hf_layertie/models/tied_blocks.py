"""The tying mechanism shared by every tied model: blocks in an `nn.ModuleList` that share Parameters.

Why this design (measured on transformers 5 / torch 2.13, see docs/tied-models.md and docs/agent.md):

- A tied block holds the SAME `nn.Parameter` objects as its source. `named_parameters()` and
  therefore the optimizer, gradient buffers, DDP and `state_dict` deduplication see each shared
  weight once; aliasing separate Parameters onto one storage saves nothing but the weights and
  steps the storage once per alias.
- Every position keeps its own module (only the Parameters are shared), so per-layer attributes
  such as `layer_idx`, which indexes the KV cache, or Qwen2's per-layer attention type stay right.
- A re-tie moves Parameters rather than copying them wherever it can (see `retie`), and a block that
  gets weights of its own starts from a fresh copy of the *current* weights it used.
- Built from a config with a map, a tied model materialises and initialises its distinct blocks only, each
  owner bit-identical to a build of every block for the same seed (`lean_construction.py`).
- The ties are declared to transformers (`_tied_weights_keys`, `all_tied_weights_keys`), so
  `save_pretrained` writes each shared tensor once and `from_pretrained` restores the sharing. These are private
  transformers APIs: `_compat.py` lists them and refuses, at import, a transformers they were not verified with.

Like `tying_map.py`, this file only uses relative imports: it is copied next to checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import inspect
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import ADAPTER_CONFIG_NAME
from transformers.utils.hub import DownloadKwargs

from ._compat import children, declare_tied_weights, declared_tied_weights, is_fsdp_sharded, own_parameters
from .adapter_export import AdapterExportMixin, is_adapter_layer
from .configuration_tying import check_skipped_positions, check_tie_init
from .lean_construction import distinct_blocks_only
from .tying_map import RetieReport, TyingMap

# `from_pretrained`'s arguments that say where and how to read a checkpoint's files, as transformers lists them.
_DOWNLOAD_KWARGS = tuple(DownloadKwargs.__annotations__)


def _forward_skipping_positions(base_forward):
    """A tied class's `forward`: `base_forward` (its transformers class's), computing the active positions alone
    (`TiedBlocksMixin.active_positions`, `computing_only`). Its signature is the base's plus `skipped_positions`:
    `generate` passes a keyword on to `forward` only when the signature names it."""

    def forward(self, *args, skipped_positions: Sequence[int] | None = None, **kwargs):
        active = self.active_positions(skipped_positions)
        with self.loop_recipe(active), self.computing_only(active):
            return base_forward(self, *args, **kwargs)

    signature = inspect.signature(base_forward)
    parameters = list(signature.parameters.values())
    at = next((index for index, parameter in enumerate(parameters) if parameter.kind is parameter.VAR_KEYWORD), len(parameters))
    skipped = inspect.Parameter("skipped_positions", inspect.Parameter.KEYWORD_ONLY, default=None)
    forward.__signature__ = signature.replace(parameters=[*parameters[:at], skipped, *parameters[at:]])
    forward.__doc__ = (
        f"{base_forward.__doc__ or ''}\n\nskipped_positions (`list[int]`, *optional*): block positions this call "
        "leaves out (the identity), as `config.skipped_positions` does; None takes the config's, [] computes all."
    )
    forward.__name__ = forward.__qualname__ = "forward"
    return forward


def _injecting(embeddings: list):
    """A block pre-hook adding the token embeddings of this forward pass (the last `embeddings` entry, captured from
    the input embedding layer) to the block's input hidden states."""

    def hook(module, args, kwargs):
        if not embeddings:
            raise ValueError("loop_input_injection adds the token embeddings to repeated positions: pass input_ids, not inputs_embeds")
        if args:
            return (args[0] + embeddings[-1], *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + embeddings[-1]}

    return hook


def _scaling(factor: float):
    """A block hook scaling the block's update (output hidden states minus input) by `factor`."""

    def hook(module, args, kwargs, output):
        before = args[0] if args else kwargs["hidden_states"]
        after = output[0] if isinstance(output, tuple) else output
        scaled = before + (after - before) * factor
        return (scaled, *output[1:]) if isinstance(output, tuple) else scaled

    return hook


def _refuse_adapters_without_peft(folder) -> None:
    """A folder saved with adapters (relaxed ties, `add_adapter`) holds the model only with them: transformers loads
    them through PEFT, and without PEFT loads the base alone, in silence."""
    if (
        isinstance(folder, (str, os.PathLike))
        and os.path.isfile(os.path.join(folder, ADAPTER_CONFIG_NAME))
        and importlib.util.find_spec("peft") is None
    ):
        raise ImportError(
            f"{folder} holds PEFT adapters (relaxed ties) beside its tied base, and PEFT is not installed: the model "
            f"would load without them. pip install 'hf-layertie[peft]'"
        )


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters counted once per distinct `nn.Parameter` (tied blocks add nothing)."""

    total: int
    trainable: int
    embeddings: int
    blocks: int
    rest: int


def _weight_modules(module: nn.Module, prefix: str = ""):
    """`(name, module)` for `module` and every submodule holding the block's own weights.

    A PEFT tuner layer stands for its base layer, under its own name (as if unwrapped, so that blocks with and
    without adapters name their weights alike); its adapters belong to their position: a re-tie shares, copies
    or moves the base weights and leaves every position's adapters where they are.
    """
    if is_adapter_layer(module):
        yield from _weight_modules(module.base_layer, prefix)
        return
    yield prefix, module
    for name, child in children(module).items():
        if child is not None:
            yield from _weight_modules(child, f"{prefix}.{name}" if prefix else name)


def _block_parameters(block: nn.Module) -> dict[str, nn.Parameter]:
    """The Parameters `block` computes with, by name within the block (PEFT adapters left out)."""
    return {
        f"{module_name}.{name}" if module_name else name: parameter
        for module_name, module in _weight_modules(block)
        for name, parameter in own_parameters(module).items()
        if parameter is not None
    }


def _use_parameters(block: nn.Module, parameters: dict[str, nn.Parameter]) -> None:
    """Make `block` compute with `parameters` (the very objects; names as `_block_parameters` gives them)."""
    for module_name, module in _weight_modules(block):
        registered = own_parameters(module)
        for name in [name for name, parameter in registered.items() if parameter is not None]:
            key = f"{module_name}.{name}" if module_name else name
            if key not in parameters:
                raise ValueError(f"cannot tie: the source block has no parameter {key!r} to share")
            registered[name] = parameters[key]


def _fresh_copy(parameter: nn.Parameter) -> nn.Parameter:
    return nn.Parameter(parameter.detach().clone(), requires_grad=parameter.requires_grad)


class _StackBuffer:
    """One buffer for every stack a regroup averages, grown to the largest: a stack allocated and freed per
    Parameter would leave its pages resident in the allocator's free lists, fragmented by the averages kept in
    between (converting 48 blocks of width 512 to 8 with `tie_init="mean"` peaked about 200 MiB higher)."""

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def stack(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        first = tensors[0]
        shape = (len(tensors), *first.shape)
        numel = len(tensors) * first.numel()
        buffer = self.buffer
        if buffer is None or buffer.dtype != first.dtype or buffer.device != first.device or buffer.numel() < numel:
            self.buffer = buffer = None
            self.buffer = buffer = torch.empty(numel, dtype=first.dtype, device=first.device)
        return torch.stack(tensors, out=buffer[:numel].view(shape))


def _mean(parameters: list[nn.Parameter], buffer: _StackBuffer | None = None) -> nn.Parameter:
    tensors = [parameter.detach() for parameter in parameters]
    stacked = (buffer or _StackBuffer()).stack(tensors)
    average = stacked.mean(dim=0, dtype=torch.promote_types(stacked.dtype, torch.float32)).to(stacked.dtype)
    return nn.Parameter(average, requires_grad=parameters[0].requires_grad)


class TiedBlocksMixin(AdapterExportMixin):
    """Adds cross-layer weight tying to a `PreTrainedModel` whose blocks live in an `nn.ModuleList`.

    A tied model class is this mixin, the transformers class and two attributes:

    ```python
    class TiedLlamaForCausalLM(TiedBlocksMixin, LlamaForCausalLM):
        config_class = TiedLlamaConfig  # TyingConfigMixin + LlamaConfig
        tied_blocks_path = "model.layers"
    ```

    The map in `config.tying_map` is the single source of truth: it is applied whenever transformers ties
    weights (at construction and at the end of `from_pretrained`), and only `retie` changes it afterwards.

    PEFT adapters on the blocks, saving with them and the plain export (`untie_adapted_blocks`, `save_pretrained`,
    `base_state_dict`, `to_untied`) come from `AdapterExportMixin`.
    """

    tied_blocks_path: str
    # Built from a config with a map, only the distinct blocks are materialised and initialised, each owner exactly
    # as when every block is (see `lean_construction.py`). False builds every block, then ties them.
    lean_construction: bool = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "tied_blocks_path" in cls.__dict__:  # a tied model class (not a wrapper's subclass, such as FSDP's)
            cls.forward = _forward_skipping_positions(super(TiedBlocksMixin, cls).forward)

    def __init__(self, config, *inputs, **kwargs):
        # By what it has, not its class: remote code may load the config class from another copy of this package.
        if not hasattr(config, "_live_bound_model"):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got config={type(config).__name__}: "
                f"convert it with {self.config_class.__name__}.from_dict({{**config.to_dict(), "
                f"'model_type': '{self.config_class.model_type}'}})"
            )
        bound = config._live_bound_model()
        if bound is not None:
            # A second model on one config (transformers' `Trainer(model_init=...)` builds one while the first is
            # still held) would have its map changed by the first one's `retie`: it gets a copy of its own.
            warnings.warn(
                f"this config already drives a {type(bound).__name__}: the new "
                f"{type(self).__name__} is built on a copy of it (its `config` is not the object passed), so that "
                "re-tying one model cannot change the other's map",
                stacklevel=2,
            )
            config = copy.deepcopy(config)
        with distinct_blocks_only(type(self), config) as construction:
            super().__init__(config, *inputs, **kwargs)
        if construction is not None:
            construction.check_order(self)
            self._share_by_map()  # transformers tied them already, unless told not to
            construction.check_no_placeholder_left(self)
        config._bind(self)
        # The map the weights about to be loaded were saved with, when `from_pretrained` was asked for another.
        self._saved_tying_map = config._take_saved_tying_map()

    def _share_by_map(self) -> None:
        """Make every tied block compute with its root's Parameter objects, as the map says."""
        blocks = self.tied_blocks
        for block, root in enumerate(self.tying_map):
            if root != block:
                _use_parameters(blocks[block], _block_parameters(blocks[root]))

    def to_empty(self, *, device, recurse: bool = True):
        """`nn.Module.to_empty`, which gives every Parameter entry a new object (a model built on the meta device,
        then materialised), then ties again: the tied blocks (and tied embeddings) get their root's objects
        again, or each would train a Parameter of its own aliasing the root's storage (stepped once per alias, its
        optimizer state duplicated)."""
        result = super().to_empty(device=device, recurse=recurse)
        self._retie_materialised()
        return result

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """`nn.Module.load_state_dict`; with `assign=True` (a meta-device model given its weights), which sets each
        entry's tensor as a new Parameter, the ties are made again (`tie_weights`), as after `to_empty`."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        if assign:
            self._retie_materialised()
        return result

    def _retie_materialised(self) -> None:
        """Blocks share their root's Parameters as the map says (through PEFT's `base_layer` where blocks carry
        adapters, which `tie_weights` leaves alone), then transformers ties the rest (embeddings)."""
        self._share_by_map()
        self.tie_weights()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        """transformers' `from_pretrained`. A built `config` whose map differs from the checkpoint's is loaded as
        `tying_map=` is: the blocks the checkpoint stores as ties get the weights they were saved sharing."""
        _refuse_adapters_without_peft(pretrained_model_name_or_path)
        if kwargs.get("quantization_config") is not None:
            raise ValueError(
                f"{cls.__name__}.from_pretrained(..., quantization_config=...): transformers keeps every tied weight out "
                "of quantization, and here that is every block that shares weights and the block it shares them with, "
                "so the model would load mostly unquantized. Load it without quantization_config, or quantize its "
                "plain export (`model.to_untied()`, saved and loaded by transformers' own class)"
            )
        # By what it has, as in `__init__`: a config class remote code loaded from another copy of this package.
        if hasattr(config, "for_checkpoint") and pretrained_model_name_or_path is not None and "gguf_file" not in kwargs:
            download_kwargs = {name: kwargs[name] for name in _DOWNLOAD_KWARGS if name in kwargs}
            config = config.for_checkpoint(pretrained_model_name_or_path, **download_kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, config=config, **kwargs)

    def __setstate__(self, state):
        # A deep-copied or unpickled model drives its (copied, unbound) config again. A shallow copy
        # (`copy.copy`) shares its original's config and blocks: a re-tie through either changes both, and the
        # config, alike, so it stays bound to the original.
        super().__setstate__(state)
        if self.config._live_bound_model() is None:
            self.config._bind(self)

    @property
    def tied_blocks(self) -> nn.ModuleList:
        return self.get_submodule(self.tied_blocks_path)

    def active_positions(self, skipped_positions: Sequence[int] | None = None) -> list[int]:
        """The block positions a forward pass computes: all but `skipped_positions` (None: the config's)."""
        skipped = self.config.skipped_positions if skipped_positions is None else skipped_positions
        skipped = check_skipped_positions(skipped, len(self.tied_blocks)) or []
        return [position for position in range(len(self.tied_blocks)) if position not in skipped]

    @contextlib.contextmanager
    def loop_recipe(self, positions: list[int]):
        """Inside, the blocks at `positions` compute with the loop recipe the config asks for: each block's update
        scaled by 1/N (`loop_residual_scale`, N the computed positions using its weights) and the token embeddings
        added to the input of each repeated position (`loop_input_injection`). Hooks, removed on leaving."""
        scale, inject = getattr(self.config, "loop_residual_scale", False), getattr(self.config, "loop_input_injection", False)
        if not (scale or inject):
            yield
            return
        roots = [self.tying_map[position] for position in positions]
        handles, embeddings = [], []
        if inject:
            handles.append(self.get_input_embeddings().register_forward_hook(lambda module, args, output: embeddings.append(output)))
        seen = set()
        for position, root in zip(positions, roots):
            block = self.tied_blocks[position]
            if inject and root in seen:
                handles.append(block.register_forward_pre_hook(_injecting(embeddings), with_kwargs=True))
            if scale and roots.count(root) > 1:
                handles.append(block.register_forward_hook(_scaling(1 / roots.count(root)), with_kwargs=True))
            seen.add(root)
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def computing_only(self, positions: list[int]):
        """Inside, the model computes `positions` alone, as the shorter model holding only their blocks would: its
        block list holds those blocks (the same modules), and their layers' `layer_idx` (which indexes the KV cache
        and the per-layer caches transformers builds) count 0, 1, ... among them. Both are put back on leaving."""
        if len(positions) == len(self.tied_blocks):
            yield
            return
        parent_path, _, name = self.tied_blocks_path.rpartition(".")
        parent, blocks = self.get_submodule(parent_path), self.tied_blocks
        indexed = [[module for module in blocks[position].modules() if hasattr(module, "layer_idx")] for position in positions]
        saved = [[module.layer_idx for module in modules] for modules in indexed]
        setattr(parent, name, nn.ModuleList([blocks[position] for position in positions]))
        for index, modules in enumerate(indexed):
            for module in modules:
                module.layer_idx = index
        try:
            yield
        finally:
            setattr(parent, name, blocks)
            for modules, indices in zip(indexed, saved):
                for module, index in zip(modules, indices):
                    module.layer_idx = index

    @property
    def tying_map(self) -> TyingMap:
        return TyingMap(self.config.tying.entries, num_blocks=len(self.tied_blocks))

    def retie(self, new_map: TyingMap | Sequence[int], tie_init: str = "root") -> RetieReport:
        """Apply `new_map` in place; accepts a `TyingMap` or a list. Any map may follow any other.

        With `tie_init="mean"`, a group whose blocks computed with different weights starts from the average of
        the weights each of its blocks used (a set of weights shared by three of them counts three times: the
        weights closest, in squared distance summed over the group's blocks, to what each computed with), as
        `from_pretrained(..., tie_init="mean")` does for a checkpoint: how a trained model is converted. What
        follows describes the default, `"root"`.

        Every block keeps computing what it computed unless its source changes. The group of each new root `r`
        starts from the weights block `r` used before (those of `s = old_map[r]`), and Parameters move rather
        than being copied where they can: old root `s`'s objects stay with `s` if it is still a root, else go to
        the group with the smallest root `r` such that `old_map[r] == s`; any other group starting from `s`
        gets fresh copies (reported in `added` and `copied_from`), and objects no group starts from disappear
        (`removed`). A move changes the order of `named_parameters()` (an optimizer that keeps its groups in that
        order, as `TyingTrainer` does, re-sorts them).
        """
        if is_fsdp_sharded(self):
            raise RuntimeError(
                f"this {type(self).__name__} is sharded with FSDP2, which keeps the groups it was sharded with: "
                f"re-tie it with hf_layertie.retie_sharded(model, optimizer, new_map) on every process"
            )
        old_map = self.tying_map
        new_map = TyingMap(new_map, num_blocks=len(self.tied_blocks))
        check_tie_init(tie_init)
        owned = {root: _block_parameters(self.tied_blocks[root]) for root in old_map.independent_blocks}
        if tie_init == "mean":
            sources = {root: [old_map[member] for member in members] for root, members in new_map.groups().items()}
        else:
            sources = {root: [old_map[root]] for root in new_map.independent_blocks}
        copied_from, kept = self._regroup(new_map, owned, sources, old_map=old_map)
        averaged_from = {
            parameter: [owned[source][name] for source in sources[root]]
            for root in new_map.independent_blocks
            if len(set(sources[root])) > 1
            for name, parameter in _block_parameters(self.tied_blocks[root]).items()
        }
        self.config._set_tying_map_of_model(new_map)
        self._declare_block_ties()
        return RetieReport(
            old_map=old_map,
            new_map=new_map,
            added=[*copied_from, *averaged_from],
            removed=[parameter for root in owned if root not in kept for parameter in owned[root].values()],
            copied_from=copied_from,
            averaged_from=averaged_from,
        )

    def _regroup(
        self,
        new_map: TyingMap,
        owned: dict[int, dict[str, nn.Parameter]],
        sources: dict[int, list[int]],
        old_map: TyingMap | None = None,
    ) -> tuple[dict[nn.Parameter, nn.Parameter], set[int]]:
        """Give every group of `new_map` the weights it starts from; return `({fresh copy: source}, kept)`.

        `owned[s]` are the Parameters block `s` held before; group `r` starts from `owned[s]` for `s` in
        `sources[r]` (their mean when several differ). `owned[s]`'s objects go to the first group (smallest root)
        that starts from `s` alone, and `kept` lists those `s`; other groups get copies. A group without sources
        keeps its root's Parameters. With `old_map` (the map the blocks compute with now), blocks that already
        hold the objects they get are left alone: one decision re-points one block or one group, not all of them.
        """
        keeper = {}
        for root in new_map.independent_blocks:
            if len(set(sources[root])) == 1:
                keeper.setdefault(sources[root][0], root)
        copied_from = {}
        buffer = _StackBuffer()
        for root, members in new_map.groups().items():
            chosen = sorted(set(sources[root]))
            if not chosen:
                parameters = _block_parameters(self.tied_blocks[root])
            elif len(chosen) > 1:
                parameters = {
                    name: _mean([owned[source][name] for source in sources[root]], buffer) for name in owned[chosen[0]]
                }
            elif keeper[chosen[0]] == root:
                parameters = owned[chosen[0]]
                if old_map is not None:
                    members = [member for member in members if old_map[member] != chosen[0]]
            else:
                parameters = {name: _fresh_copy(parameter) for name, parameter in owned[chosen[0]].items()}
                copied_from.update(zip(parameters.values(), owned[chosen[0]].values()))
            for member in members:
                _use_parameters(self.tied_blocks[member], parameters)
        return copied_from, set(keeper)

    def tie_weights(self, missing_keys: set[str] | None = None, recompute_mapping: bool = True):
        # transformers ties every block pair declared in `all_tied_weights_keys` (and leaves them apart while
        # `from_pretrained` loads). At the end of loading, the only call with `missing_keys`, each group first gets
        # the weights `tie_init` picks, so that transformers finds the pairs of a plain checkpoint equal.
        if missing_keys is not None:
            self._start_from_checkpoint(missing_keys)
        super().tie_weights(missing_keys=missing_keys, recompute_mapping=recompute_mapping)

    def _start_from_checkpoint(self, missing_keys: set[str]) -> None:
        """Give each tie group the weights `config.tie_init` picks from a just-loaded checkpoint.

        Block `b` used its own weights if the checkpoint holds them, else those of its root in the map the
        checkpoint was saved with. Blocks of a group that get weights this way are no longer missing.
        """
        prefix = f"{self.tied_blocks_path}."
        absent = {int(key[len(prefix) :].split(".")[0]) for key in missing_keys if key.startswith(prefix)}
        saved_map, self._saved_tying_map = self._saved_tying_map, None
        if saved_map is None:
            saved_map = self.tying_map
            self._refuse_weights_the_map_ties(absent)
        # A checkpoint of more blocks (loaded with fewer layers) tied its first ones as its map's prefix says; a block
        # beyond a checkpoint of fewer has no weights there.
        used = [
            saved_map[block] if block in absent and block < len(saved_map) else block for block in range(len(self.tied_blocks))
        ]
        owned = {block: _block_parameters(self.tied_blocks[block]) for block in set(used) - absent}
        tying_map = self.tying_map
        averaged = self.config.tie_init == "mean"
        sources = {
            root: [used[block] for block in (members if averaged else [root]) if used[block] in owned]
            for root, members in tying_map.groups().items()
        }
        self._regroup(tying_map, owned, sources)
        for root, members in tying_map.groups().items():
            if sources[root]:
                names = _block_parameters(self.tied_blocks[root])
                missing_keys.difference_update(f"{prefix}{member}.{name}" for member in members for name in names)

    def _refuse_weights_the_map_ties(self, absent: set[int]) -> None:
        """A checkpoint loaded with its own config's map stores only the blocks that own weights under it: weights
        of a block the map ties to another mean that config.json and the weights file disagree (a map edited by
        hand, files of two saves mixed), and transformers would drop them without a word."""
        extra = [block for block, source in enumerate(self.tying_map) if source != block and block not in absent]
        if extra:
            raise ValueError(
                f"{self.config.name_or_path}: the weights file holds weights of block(s) {', '.join(map(str, extra))}, "
                f"which the map in its config.json ({self.tying_map.render()}) ties to another block: the map and the "
                f"weights disagree, and those weights would be dropped. Load it with tying_map={list(range(len(self.tying_map)))} "
                f"to read every block's own weights (then retie), or mend the map in config.json"
            )

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """The class's own ties (embeddings) plus one escaped prefix pattern per tied block.

        `save_pretrained` matches these with `re.search` to drop duplicates; escaping and the final dot keep
        `transformer.h.1.` from matching blocks 10 and 11.
        """
        path = self.tied_blocks_path
        block_keys = {
            re.escape(f"{path}.{block}."): re.escape(f"{path}.{root}.")
            for block, root in enumerate(self.tying_map)
            if root != block
        }
        return {**(super()._tied_weights_keys or {}), **block_keys}

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """transformers' `{target: source}` names, plus one entry per Parameter of every tied block.

        Built from the map without transformers' regex expansion (slow for hundreds of names). Block ties are
        added even when `tie_word_embeddings=False`, where transformers would return `{}` and the block ties
        would be lost on load. The class's own ties are parameter names in every tied class.
        """
        if all_submodels:  # `tie_weights()` called on its own (`resize_token_embeddings`)
            expanded = super().get_expanded_tied_weights_keys(all_submodels=True)
            if not self.adapted_blocks():
                return expanded
            # The blocks share their objects already, and adapters (relaxed ties) moved them under `base_layer`:
            # tied again by name, each would be set on PEFT's wrapper.
            prefix = f"{self.tied_blocks_path}."
            return {target: source for target, source in expanded.items() if not target.startswith(prefix)}
        own = super()._tied_weights_keys if getattr(self.config, "tie_word_embeddings", False) else None
        return {**(own or {}), **self._tied_block_parameter_names()}

    def _declare_block_ties(self) -> None:
        """Bring `all_tied_weights_keys` in step with the map, keeping transformers' own (embedding) entries."""
        prefix = f"{self.tied_blocks_path}."
        declared = declared_tied_weights(self)
        others = {target: source for target, source in declared.items() if not target.startswith(prefix)}
        declare_tied_weights(self, {**others, **self._tied_block_parameter_names()})

    def _tied_block_parameter_names(self) -> dict[str, str]:
        path, blocks = self.tied_blocks_path, self.tied_blocks
        tying_map = self.tying_map
        root_names = {root: list(_block_parameters(blocks[root])) for root in set(tying_map)}
        return {
            f"{path}.{block}.{name}": f"{path}.{root}.{name}"
            for block, root in enumerate(tying_map)
            if root != block
            for name in root_names[root]
        }

    def _adjust_bias(self, output_embeddings, input_embeddings):
        # transformers resizes the bias of every tied target as if it were an output embedding; on
        # GPT-2's Conv1D this truncates `c_attn.bias`. Only the real output embedding needs it.
        if output_embeddings is self.get_output_embeddings():
            super()._adjust_bias(output_embeddings, input_embeddings)

    def untied_parameter_count(self) -> int:
        """Parameters of the same model with every block owning its weights: `to_untied()`'s, adapters merged in."""
        counts = self.parameter_counts()
        per_block = sum(parameter.numel() for block in self.tied_blocks for parameter in _block_parameters(block).values())
        return counts.total - counts.blocks + per_block

    def parameter_counts(self) -> ParameterCounts:
        """Total and trainable parameters, split into embeddings, blocks and the rest."""
        block_ids = {id(parameter) for parameter in self.tied_blocks.parameters()}
        embedding_ids = {
            id(parameter)
            for module in self.modules()
            if isinstance(module, nn.Embedding)
            for parameter in module.parameters()
        }
        parameters = list(self.parameters())
        return ParameterCounts(
            total=sum(parameter.numel() for parameter in parameters),
            trainable=sum(parameter.numel() for parameter in parameters if parameter.requires_grad),
            embeddings=sum(parameter.numel() for parameter in parameters if id(parameter) in embedding_ids),
            blocks=sum(parameter.numel() for parameter in parameters if id(parameter) in block_ids),
            rest=sum(
                parameter.numel()
                for parameter in parameters
                if id(parameter) not in block_ids and id(parameter) not in embedding_ids
            ),
        )
