"""PEFT adapters on tied blocks, and what a tied model writes out: its checkpoint with adapters, its plain export.

Kept apart from the tying core (`tied_blocks.py`), which only needs `is_adapter_layer` from here: every tied class
inherits `AdapterExportMixin` through `TiedBlocksMixin`. Like the other files of this folder it only uses relative
imports: it is copied next to checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME

from ._compat import carries_integrated_adapters, is_fsdp_sharded, is_persistent_buffer, saving_whole_model
from .configuration_tying import LOOP_RECIPE_FIELDS, TYING_FIELDS
from .tying_map import RetieReport

# Config keys that name the tied classes; a plain config (`to_untied`) leaves them out with the tying fields.
_TIED_CLASS_KEYS = ("model_type", "architectures", "auto_map", "transformers_version")


def is_adapter_layer(module: nn.Module) -> bool:
    """Whether `module` is a PEFT tuner layer (LoRA, IA3, ...): it wraps a `base_layer` and adds adapter layers.

    Recognised by PEFT's `BaseTunerLayer` attributes rather than by class, so that this file needs no `peft`.
    """
    return hasattr(module, "adapter_layer_names") and hasattr(module, "base_layer")


@contextlib.contextmanager
def _base_named_nowhere(peft_configs: dict):
    """Each adapter's `base_model_name_or_path` empty while it is saved beside its tied base: transformers loads
    that base instead of the folder's when the folder is not local (`AdapterExportMixin.save_pretrained`)."""
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


def _dot_positions(key: str):
    """The ends of `key`'s dotted prefixes, longest last (`a.b.c` -> 1, 3)."""
    return (index for index, character in enumerate(key) if character == ".")


class AdapterExportMixin:
    """PEFT adapters on the tied blocks of a `TiedBlocksMixin` model, its save with them, and its plain export.

    PEFT adapters (LoRA, ...) on tied blocks belong to their position: each position trains its own adapter on the
    shared weights, and `retie` moves the weights under them. Merging them needs `untie_adapted_blocks()` first.
    Uses the tying core's `tied_blocks`, `tying_map` and `retie`.
    """

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "peft_config":  # PEFT (and transformers' `add_adapter`) set it once the adapters are in place
            self._warn_if_adapters_share_weights()

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
        adapted = self.adapted_blocks()
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

    def adapted_blocks(self) -> dict[int, list[nn.Module]]:
        """`{block: its PEFT tuner layers}` for every block that has some."""
        layers = {
            block: [module for module in self.tied_blocks[block].modules() if is_adapter_layer(module)]
            for block in range(len(self.tied_blocks))
        }
        return {block: found for block, found in layers.items() if found}

    def adapted_blocks_sharing_weights(self) -> list[int]:
        """The blocks with PEFT adapters whose weights other blocks share: relaxed ties, each position's adapter on
        the shared weights."""
        tying_map = self.tying_map
        groups = tying_map.groups()
        return [block for block in self.adapted_blocks() if len(groups[tying_map[block]]) > 1]

    def _warn_if_adapters_share_weights(self) -> None:
        tying_map = self.tying_map
        sharing = self.adapted_blocks_sharing_weights()
        if sharing:
            warnings.warn(
                f"PEFT adapters were added to blocks {sharing}, which share their weights with other blocks "
                f"(tying map {tying_map.render()}). Training and inference are correct, but a merge "
                f"(merge_and_unload, merge_adapter) would add every position's update into the shared weights: "
                f"call untie_adapted_blocks() before merging (to_untied() merges each position into its own weights).",
                stacklevel=3,
            )

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
        if is_fsdp_sharded(self):
            raise RuntimeError(
                f"this {type(self).__name__} is sharded with FSDP2, whose weights save_pretrained cannot write: save "
                f"the unsharded copy that hf_layertie.gather_tied_model(model) returns on every process, from one"
            )
        if not carries_integrated_adapters(self):
            if kwargs.get("is_main_process", True):
                _remove_adapter_files(save_directory)
            return super().save_pretrained(save_directory, state_dict=state_dict, **kwargs)
        if kwargs.get("push_to_hub"):
            raise ValueError(
                "push_to_hub=True would upload only what one save writes; save the model with adapters, then upload "
                "the folder (huggingface_hub.upload_folder)"
            )
        with saving_whole_model(self):
            super().save_pretrained(save_directory, state_dict=self.base_state_dict(state_dict), **kwargs)
        with _base_named_nowhere(self.peft_config):
            return super().save_pretrained(save_directory, state_dict=state_dict, **kwargs)

    def base_state_dict(self, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """`state_dict` (the model's by default) without PEFT adapters, each adapted layer's base weights under the
        layer's own name: the state dict of the tied model the adapters sit on."""
        state_dict = self.state_dict() if state_dict is None else state_dict
        names = self.base_state_names(state_dict)
        return {names[key]: value for key, value in state_dict.items() if key in names}

    def base_state_names(self, keys) -> dict[str, str]:
        """`{key: its name in the base state dict}` for the `keys` (of this model's state dict) that are not adapter
        weights: how a tied checkpoint's names map onto this model once adapters wrap its layers."""
        adapted = {name for name, module in self.named_modules() if is_adapter_layer(module)}
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
            base
            for base in cls.__mro__
            if issubclass(base, PreTrainedModel) and not issubclass(base, AdapterExportMixin)
        )

    def to_untied(self, positions: list[int] | None = None) -> PreTrainedModel:
        """The equivalent plain transformers model (e.g. `LlamaForCausalLM`): every block owns a copy of its weights.

        Its `save_pretrained` writes a checkpoint that stock transformers, and tools built on it (vLLM,
        llama.cpp's converter), load without hf-layertie or remote code, with the same logits. PEFT adapters
        (relaxed ties) are merged into each position's own copy of its weights; this model keeps them. Positions
        the config skips (`skipped_positions`) are left out: the export is the shorter model this one computes as.
        `positions` (ascending) exports those positions instead: one loop of a looped map is the layers of the
        looped serving format (`hf_layertie.save_for_serving`).
        """
        active = self.active_positions() if positions is None else list(positions)
        if positions is not None and (not active or active != sorted(set(active)) or not 0 <= active[0] <= active[-1] < len(self.tied_blocks)):
            raise ValueError(f"to_untied(positions={positions!r}): expected ascending block positions of 0 to {len(self.tied_blocks) - 1}")
        recipe = [name for name in LOOP_RECIPE_FIELDS if getattr(self.config, name, False)]
        if recipe:
            raise ValueError(
                f"to_untied(): this model computes with {', '.join(recipe)}, which no plain transformers class "
                f"computes: its export would give other logits. Serve it with this package (or remote code)"
            )
        adapted = any(is_adapter_layer(module) for module in self.modules())
        state_dict = self._merged_state_dict() if adapted else self.state_dict()
        plain_class = self.untied_class()
        config_dict = {
            key: value for key, value in self.config.to_dict().items() if key not in TYING_FIELDS + _TIED_CLASS_KEYS
        }
        state_dict = self._named_as_exported(state_dict.items(), active)
        config_dict[self.config.attribute_map.get("num_hidden_layers", "num_hidden_layers")] = len(active)
        if isinstance(config_dict.get("layer_types"), list):  # Qwen2's and Mistral's per-layer attention
            config_dict["layer_types"] = [config_dict["layer_types"][position] for position in active]
        plain_config = plain_class.config_class.from_dict(config_dict)
        # Not in `to_dict()`: the attention this model computes with (eager returns attention weights; the default,
        # sdpa, does not).
        plain_config._attn_implementation = self.config._attn_implementation
        # Built on the meta device and given copies of these weights: no random initialisation, and no memory beyond
        # the copies (each block its own).
        with torch.device("meta"):
            plain = plain_class(plain_config)
        plain.load_state_dict({name: tensor.clone() for name, tensor in state_dict.items()}, assign=True)
        plain.tie_weights()  # its own ties (embeddings), which separate copies would have cut
        # `assign=True` keeps the new model's `requires_grad`: the weights frozen here stay frozen there. An adapted
        # model's export is trainable throughout, as a merged model is (PEFT freezes the weights under its adapters,
        # and loading adapters freezes every base weight).
        if not adapted:
            own_parameters = self._named_as_exported(self.named_parameters(remove_duplicate=False), active)
            for name, parameter in plain.named_parameters(remove_duplicate=False):
                if name in own_parameters:
                    parameter.requires_grad_(own_parameters[name].requires_grad)
        # Buffers: copies of this model's, in its dtypes (rotary `inv_freq` stays float32 in a half-precision model);
        # the non-persistent ones are in no state dict and would stay on the meta device.
        own_buffers = self._named_as_exported(self.named_buffers(remove_duplicate=False), active)
        for name, _ in plain.named_buffers(remove_duplicate=False):
            module_name, _, buffer_name = name.rpartition(".")
            module = plain.get_submodule(module_name)
            persistent = is_persistent_buffer(module, buffer_name)
            module.register_buffer(buffer_name, own_buffers[name].clone(), persistent=persistent)
        if self.can_generate():
            plain.generation_config = copy.deepcopy(self.generation_config)
        return plain.train(self.training)

    def _named_as_exported(self, named, active: list[int]) -> dict:
        """`named` (pairs of this model's names and values) under the names `to_untied()`'s model gives them: the
        blocks of the `active` positions renumbered among them (`config.skipped_positions`), those of skipped
        positions left out; names outside the blocks kept."""
        prefix = f"{self.tied_blocks_path}."
        exported = {}
        for name, value in named:
            if name.startswith(prefix):
                position, _, rest = name[len(prefix) :].partition(".")
                if int(position) not in active:
                    continue
                name = f"{prefix}{active.index(int(position))}.{rest}"
            exported[name] = value
        return exported

    def _merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The plain state dict of this model with the adapters it computes with merged: each position's into its
        own weights (PEFT's merge, on a copy whose adapted blocks were untied first: `untie_adapted_blocks`), those
        outside the blocks into their layers. Disabled adapters (`disable_adapters()`) are left out, as the model
        leaves them out. The copy costs the model's memory while it merges."""
        merged = [name for name, module in self.named_modules() if is_adapter_layer(module) and module.merged]
        if merged:
            shown = ", ".join(merged[:3]) + (", ..." if len(merged) > 3 else "")
            raise ValueError(f"the adapters of {len(merged)} layers ({shown}) are merged already: call unmerge_adapter() first")
        copied = copy.deepcopy(self)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copied.untie_adapted_blocks()
        for layer in copied.modules():
            if is_adapter_layer(layer) and not layer.disable_adapters:
                layer.merge()
        return copied.base_state_dict()
