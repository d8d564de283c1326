"""The tying mechanism shared by every tied model: blocks in an `nn.ModuleList` that share Parameters.

Why this design (measured on transformers 5 / torch 2.13, see the README's design notes):

- A tied block holds the SAME `nn.Parameter` objects as its source. `named_parameters()` and
  therefore the optimizer, gradient buffers, DDP and `state_dict` deduplication see each shared
  weight once; aliasing separate Parameters onto one storage saves nothing but the weights and
  steps the storage once per alias.
- Every position keeps its own module (only the Parameters are shared), so per-layer attributes
  such as `layer_idx`, which indexes the KV cache, or Qwen2's per-layer attention type stay right.
- A re-tie moves Parameters rather than copying them wherever it can (see `retie`), and a block that
  gets weights of its own starts from a fresh copy of the *current* weights it used.
- The ties are declared to transformers (`_tied_weights_keys`, `all_tied_weights_keys`), so
  `save_pretrained` writes each shared tensor once and `from_pretrained` restores the sharing.

Like `tying_map.py`, this file only uses relative imports: it is copied next to checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME

from .configuration_tying import TYING_FIELDS, check_tie_init
from .tying_map import TyingMap

# Config keys that name the tied classes; a plain config (`to_untied`) leaves them out with the tying fields.
_TIED_CLASS_KEYS = ("model_type", "architectures", "auto_map", "transformers_version")


@dataclass
class RetieReport:
    """What `TiedBlocksMixin.retie` changed: the trainer adds `added` to and drops `removed` from the optimizer.

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


def _is_fsdp_sharded(module: nn.Module) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters counted once per distinct `nn.Parameter` (tied blocks add nothing)."""

    total: int
    trainable: int
    embeddings: int
    blocks: int
    rest: int


def _is_adapter_layer(module: nn.Module) -> bool:
    """Whether `module` is a PEFT tuner layer (LoRA, IA3, ...): it wraps a `base_layer` and adds adapter layers.

    Recognised by PEFT's `BaseTunerLayer` attributes rather than by class, so that this file needs no `peft`.
    """
    return hasattr(module, "adapter_layer_names") and hasattr(module, "base_layer")


@contextlib.contextmanager
def _base_named_nowhere(peft_configs: dict):
    """Each adapter's `base_model_name_or_path` empty while it is saved beside its tied base: transformers loads
    that base instead of the folder's when the folder is not local (`TiedBlocksMixin.save_pretrained`)."""
    names = {adapter: config.base_model_name_or_path for adapter, config in peft_configs.items()}
    try:
        for config in peft_configs.values():
            config.base_model_name_or_path = None
        yield
    finally:
        for adapter, name in names.items():
            peft_configs[adapter].base_model_name_or_path = name


def _remove_adapter_files(folder: str | os.PathLike) -> None:
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            os.remove(path)


def _weight_modules(module: nn.Module, prefix: str = ""):
    """`(name, module)` for `module` and every submodule holding the block's own weights.

    A PEFT tuner layer stands for its base layer, under its own name (as if unwrapped, so that blocks with and
    without adapters name their weights alike); its adapters belong to their position: a re-tie shares, copies
    or moves the base weights and leaves every position's adapters where they are.
    """
    if _is_adapter_layer(module):
        yield from _weight_modules(module.base_layer, prefix)
        return
    yield prefix, module
    for name, child in module._modules.items():
        if child is not None:
            yield from _weight_modules(child, f"{prefix}.{name}" if prefix else name)


def _block_parameters(block: nn.Module) -> dict[str, nn.Parameter]:
    """The Parameters `block` computes with, by name within the block (PEFT adapters left out)."""
    return {
        f"{module_name}.{name}" if module_name else name: parameter
        for module_name, module in _weight_modules(block)
        for name, parameter in module._parameters.items()
        if parameter is not None
    }


def _use_parameters(block: nn.Module, parameters: dict[str, nn.Parameter]) -> None:
    """Make `block` compute with `parameters` (the very objects; names as `_block_parameters` gives them)."""
    for module_name, module in _weight_modules(block):
        for name in [name for name, parameter in module._parameters.items() if parameter is not None]:
            key = f"{module_name}.{name}" if module_name else name
            if key not in parameters:
                raise ValueError(f"cannot tie: the source block has no parameter {key!r} to share")
            module._parameters[name] = parameters[key]


def _dot_positions(key: str):
    """The ends of `key`'s dotted prefixes, longest last (`a.b.c` -> 1, 3)."""
    return (index for index, character in enumerate(key) if character == ".")


def _fresh_copy(parameter: nn.Parameter) -> nn.Parameter:
    return nn.Parameter(parameter.detach().clone(), requires_grad=parameter.requires_grad)


def _mean(parameters: list[nn.Parameter]) -> nn.Parameter:
    stacked = torch.stack([parameter.detach() for parameter in parameters])
    average = stacked.mean(dim=0, dtype=torch.float32).to(stacked.dtype)
    return nn.Parameter(average, requires_grad=parameters[0].requires_grad)


class TiedBlocksMixin:
    """Adds cross-layer weight tying to a `PreTrainedModel` whose blocks live in an `nn.ModuleList`.

    A tied model class is this mixin, the transformers class and two attributes:

    ```python
    class TiedLlamaForCausalLM(TiedBlocksMixin, LlamaForCausalLM):
        config_class = TiedLlamaConfig  # TyingConfigMixin + LlamaConfig
        tied_blocks_path = "model.layers"
    ```

    The map in `config.tying_map` is the single source of truth: it is applied whenever transformers ties
    weights (at construction and at the end of `from_pretrained`), and only `retie` changes it afterwards.

    PEFT adapters (LoRA, ...) on tied blocks belong to their position: each position trains its own adapter on the
    shared weights, and `retie` moves the weights under them. Merging them needs `untie_adapted_blocks()` first.
    """

    tied_blocks_path: str

    def __init__(self, config, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        config._bind(self)
        # The map the weights about to be loaded were saved with, when `from_pretrained` was asked for another.
        self._saved_tying_map = config._take_saved_tying_map()

    def __setstate__(self, state):
        # A copied or unpickled model drives its (copied, unbound) config again.
        super().__setstate__(state)
        self.config._bind(self)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "peft_config":  # PEFT (and transformers' `add_adapter`) set it once the adapters are in place
            self._warn_if_adapters_share_weights()

    @property
    def tied_blocks(self) -> nn.ModuleList:
        return self.get_submodule(self.tied_blocks_path)

    @property
    def tying_map(self) -> TyingMap:
        return TyingMap(self.config.tying.entries, num_blocks=len(self.tied_blocks))

    def retie(self, new_map: TyingMap | Sequence[int], tie_init: str = "root") -> RetieReport:
        """Apply `new_map` in place; accepts a `TyingMap` or a list. Any map may follow any other.

        With `tie_init="mean"`, a group whose blocks computed with different weights starts from their average
        (each distinct set of weights counted once), as `from_pretrained(..., tie_init="mean")` does for a
        checkpoint: how a trained model is converted. What follows describes the default, `"root"`.

        Every block keeps computing what it computed unless its source changes. The group of each new root `r`
        starts from the weights block `r` used before (those of `s = old_map[r]`), and Parameters move rather
        than being copied where they can: old root `s`'s objects stay with `s` if it is still a root, else go to
        the group with the smallest root `r` such that `old_map[r] == s`; any other group starting from `s`
        gets fresh copies (reported in `added` and `copied_from`), and objects no group starts from disappear
        (`removed`). A move changes the order of `named_parameters()` (an optimizer that keeps its groups in that
        order, as `TyingTrainer` does, re-sorts them).
        """
        if _is_fsdp_sharded(self):
            raise RuntimeError(
                f"this {type(self).__name__} is sharded with FSDP2, which keeps the groups it was sharded with: "
                f"re-tie it with hf_layertie.retie_sharded(model, optimizer, new_map) on every process"
            )
        old_map = self.tying_map
        new_map = TyingMap(new_map, num_blocks=len(self.tied_blocks))
        check_tie_init(tie_init)
        owned = {root: _block_parameters(self.tied_blocks[root]) for root in old_map.independent_blocks}
        if tie_init == "mean":
            sources = {root: sorted({old_map[member] for member in members}) for root, members in new_map.groups().items()}
        else:
            sources = {root: [old_map[root]] for root in new_map.independent_blocks}
        copied_from, kept = self._regroup(new_map, owned, sources, old_map=old_map)
        averaged_from = {
            parameter: [owned[source][name] for source in sources[root]]
            for root in new_map.independent_blocks
            if len(sources[root]) > 1
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
        for root, members in new_map.groups().items():
            chosen = sorted(set(sources[root]))
            if not chosen:
                parameters = _block_parameters(self.tied_blocks[root])
            elif len(chosen) > 1:
                parameters = {
                    name: _mean([owned[source][name] for source in sources[root]]) for name in owned[chosen[0]]
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

    def untie_adapted_blocks(self) -> RetieReport:
        """Give every block that carries PEFT adapters weights of its own, so that merging the adapters is correct.

        A PEFT merge (`merge_and_unload`, `merge_adapter`) adds each adapted layer's update into the weight of its
        base layer. Tied blocks share that weight: the merge would add the update of every position into it, and
        change the group's blocks without adapters too. Untie them first; PEFT forwards the call to this model:

        ```python
        peft_model.untie_adapted_blocks()
        merged = peft_model.merge_and_unload()  # this model, each adapted block owning its merged weights
        ```

        Blocks without adapters keep sharing weights with each other. The untied blocks start from copies of the
        weights they used (as in `retie`), which costs their memory: the merged model needs it anyway.
        """
        adapted = self._adapted_blocks()
        merged = sorted(block for block, layers in adapted.items() if any(layer.merged for layer in layers))
        if merged:
            raise ValueError(
                f"the adapters of blocks {merged} are merged already: call unmerge_adapter() before "
                f"untie_adapted_blocks(), then merge"
            )
        first_without_adapters: dict[int, int] = {}
        return self.retie(
            [
                block if block in adapted else first_without_adapters.setdefault(root, block)
                for block, root in enumerate(self.tying_map)
            ]
        )

    def _adapted_blocks(self) -> dict[int, list[nn.Module]]:
        """`{block: its PEFT tuner layers}` for every block that has some."""
        layers = {
            block: [module for module in self.tied_blocks[block].modules() if _is_adapter_layer(module)]
            for block in range(len(self.tied_blocks))
        }
        return {block: found for block, found in layers.items() if found}

    def _warn_if_adapters_share_weights(self) -> None:
        adapted = self._adapted_blocks()
        tying_map = self.tying_map
        sharing = [block for block in adapted if len(tying_map.groups()[tying_map[block]]) > 1]
        if sharing:
            warnings.warn(
                f"PEFT adapters were added to blocks {sharing}, which share their weights with other blocks "
                f"(tying map {tying_map.render()}). Training and inference are correct, but a merge "
                f"(merge_and_unload, merge_adapter) would add every position's update into the shared weights: "
                f"call untie_adapted_blocks() before merging (to_untied() merges each position into its own weights).",
                stacklevel=3,
            )

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
        if saved_map is None or len(saved_map) != len(self.tied_blocks):
            saved_map = self.tying_map
        used = [block if block not in absent else saved_map[block] for block in range(len(saved_map))]
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
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        own = super()._tied_weights_keys if getattr(self.config, "tie_word_embeddings", False) else None
        return {**(own or {}), **self._tied_block_parameter_names()}

    def _declare_block_ties(self) -> None:
        """Bring `all_tied_weights_keys` in step with the map, keeping transformers' own (embedding) entries."""
        prefix = f"{self.tied_blocks_path}."
        declared = self.all_tied_weights_keys
        others = {target: source for target, source in declared.items() if not target.startswith(prefix)}
        self.all_tied_weights_keys = {**others, **self._tied_block_parameter_names()}

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

    def save_pretrained(self, save_directory: str | os.PathLike, state_dict: dict | None = None, **kwargs):
        """`PreTrainedModel.save_pretrained`; a model carrying adapters added through transformers (`add_adapter`,
        `load_adapter`, relaxed ties) also writes its tied base, next to the adapters.

        transformers saves such a model as its adapters alone, expecting the base to be a published checkpoint;
        a tied base rarely is (its map and shared weights are what was trained), and relaxed ties train it.
        The folder then holds both, in transformers' layout of a local model with an embedded adapter:
        `from_pretrained(save_directory)` loads the base from it, then the adapters. Only from a local folder:
        given a Hub repo id, transformers would load the base named in `adapter_config.json` instead, so that
        field is left empty (an error rather than another model); download the repo first
        (`from_pretrained(huggingface_hub.snapshot_download(repo_id))`), or share `to_untied()`'s merged export.
        A model without adapters saved into a folder that held some removes their files, which would otherwise
        be loaded with it.
        A model sharded with FSDP2 is refused before anything is written: transformers would write its config, then
        fail on the sharded weights (or block in a collective when called from one process).
        """
        if _is_fsdp_sharded(self):
            raise RuntimeError(
                f"this {type(self).__name__} is sharded with FSDP2, whose weights save_pretrained cannot write: save "
                f"the unsharded copy that hf_layertie.gather_tied_model(model) returns on every process, from one"
            )
        if not self._carries_integrated_adapters():
            if kwargs.get("is_main_process", True):
                _remove_adapter_files(save_directory)
            return super().save_pretrained(save_directory, state_dict=state_dict, **kwargs)
        if kwargs.get("push_to_hub"):
            raise ValueError(
                "push_to_hub=True would upload only what one save writes; save the model with adapters, then upload "
                "the folder (huggingface_hub.upload_folder)"
            )
        with self._saving_without_adapters():
            super().save_pretrained(save_directory, state_dict=self.base_state_dict(state_dict), **kwargs)
        with _base_named_nowhere(self.peft_config):
            return super().save_pretrained(save_directory, state_dict=state_dict, **kwargs)

    def _carries_integrated_adapters(self) -> bool:
        """Whether adapters were added through transformers (`add_adapter`, `load_adapter`, relaxed ties):
        transformers' own flag, which also switches `save_pretrained` to an adapter-only save."""
        return getattr(self, "_hf_peft_config_loaded", False)

    @contextlib.contextmanager
    def _saving_without_adapters(self):
        """transformers' switch between an adapter-only save and a full one, set to the full one."""
        self._hf_peft_config_loaded = False
        try:
            yield
        finally:
            self._hf_peft_config_loaded = True

    def base_state_dict(self, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """`state_dict` (the model's by default) without PEFT adapters, each adapted layer's base weights under the
        layer's own name: the state dict of the tied model the adapters sit on."""
        state_dict = self.state_dict() if state_dict is None else state_dict
        names = self._base_state_names(state_dict)
        return {names[key]: value for key, value in state_dict.items() if key in names}

    def _base_state_names(self, keys) -> dict[str, str]:
        """`{key: its name in the base state dict}` for the keys that are not adapter weights."""
        adapted = {name for name, module in self.named_modules() if _is_adapter_layer(module)}
        names = {}
        for key in keys:
            layer = next((key[:end] for end in _dot_positions(key) if key[:end] in adapted), None)
            if layer is None:
                names[key] = key
            elif key.startswith(f"{layer}.base_layer."):
                names[key] = layer + key[len(layer) + len(".base_layer") :]
        return names

    @classmethod
    def untied_class(cls) -> type[PreTrainedModel]:
        """The transformers class this one ties the blocks of (e.g. `LlamaForCausalLM`), which `to_untied` returns."""
        return next(
            base for base in cls.__mro__ if issubclass(base, PreTrainedModel) and not issubclass(base, TiedBlocksMixin)
        )

    def to_untied(self) -> PreTrainedModel:
        """The equivalent plain transformers model (e.g. `LlamaForCausalLM`): every block owns a copy of its weights.

        Its `save_pretrained` writes a checkpoint that stock transformers, and tools built on it (vLLM,
        llama.cpp's converter), load without hf-layertie or remote code, with the same logits. PEFT adapters
        (relaxed ties) are merged into each position's own copy of its weights; this model keeps them.
        """
        adapted = any(_is_adapter_layer(module) for module in self.modules())
        state_dict = self._merged_state_dict() if adapted else self.state_dict()
        plain_class = self.untied_class()
        config_dict = {
            key: value for key, value in self.config.to_dict().items() if key not in TYING_FIELDS + _TIED_CLASS_KEYS
        }
        plain = plain_class(plain_class.config_class.from_dict(config_dict)).to(device=self.device, dtype=self.dtype)
        plain.load_state_dict(state_dict)
        # Buffers keep this model's dtypes: casting them with the weights would turn rotary `inv_freq` (float32
        # in a half-precision model loaded by transformers) into half precision and change the logits.
        own_buffers = dict(self.named_buffers(remove_duplicate=False))
        for name, _ in plain.named_buffers(remove_duplicate=False):
            module_name, _, buffer_name = name.rpartition(".")
            module = plain.get_submodule(module_name)
            persistent = buffer_name not in module._non_persistent_buffers_set
            module.register_buffer(buffer_name, own_buffers[name].clone(), persistent=persistent)
        if self.can_generate():
            plain.generation_config = copy.deepcopy(self.generation_config)
        return plain.train(self.training)

    def _merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The plain state dict of this model with the adapters it computes with merged: each position's into its
        own weights (PEFT's merge, on a copy whose adapted blocks were untied first: `untie_adapted_blocks`), those
        outside the blocks into their layers. Disabled adapters (`disable_adapters()`) are left out, as the model
        leaves them out. The copy costs the model's memory while it merges."""
        merged = [name for name, module in self.named_modules() if _is_adapter_layer(module) and module.merged]
        if merged:
            shown = ", ".join(merged[:3]) + (", ..." if len(merged) > 3 else "")
            raise ValueError(f"the adapters of {len(merged)} layers ({shown}) are merged already: call unmerge_adapter() first")
        copied = copy.deepcopy(self)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copied.untie_adapted_blocks()
        for layer in copied.modules():
            if _is_adapter_layer(layer) and not layer.disable_adapters:
                layer.merge()
        return copied.base_state_dict()

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
