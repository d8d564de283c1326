"""The tying mechanism shared by every tied model: blocks in an `nn.ModuleList` that share Parameters.

Why this design (measured on transformers 5 / torch 2.13, see the README's design notes):

- A tied block holds the SAME `nn.Parameter` objects as its source. `named_parameters()` and
  therefore the optimizer, gradient buffers, DDP and `state_dict` deduplication see each shared
  weight once; aliasing separate Parameters onto one storage saves nothing but the weights and
  steps the storage once per alias.
- Every position keeps its own module (only the Parameters are shared), so per-layer attributes
  such as GPT-2's `layer_idx`, which indexes the KV cache, stay right.
- Untying gives the block a fresh copy of its source's *current* weights, so it continues from
  where the shared weights are rather than from a stale snapshot.
- The ties are declared to transformers through `get_expanded_tied_weights_keys`, so
  `save_pretrained` writes each shared tensor once and `from_pretrained` restores the sharing.

Like `tying_map.py`, this file only uses relative imports: it is copied next to checkpoints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import nn

from .tying_map import TyingMap


@dataclass
class RetieReport:
    """What `TiedBlocksMixin.retie` changed: the trainer adds `added` to and drops `removed` from the optimizer.

    `copied_from[new]` is the Parameter an untied block's fresh Parameter was copied from, so that
    optimizer state and parameter groups can follow the weights.
    """

    old_map: TyingMap
    new_map: TyingMap
    added: list[nn.Parameter] = field(default_factory=list)
    removed: list[nn.Parameter] = field(default_factory=list)
    copied_from: dict[nn.Parameter, nn.Parameter] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.old_map != self.new_map


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters counted once per distinct `nn.Parameter` (tied blocks add nothing)."""

    total: int
    trainable: int
    embeddings: int
    blocks: int
    rest: int


def _share_parameters(target: nn.Module, source: nn.Module) -> None:
    """Make every Parameter of `target` the same object as the matching one of `source`."""
    for (target_name, target_module), (_, source_module) in zip(target.named_modules(), source.named_modules()):
        for name, parameter in source_module._parameters.items():
            if name not in target_module._parameters:
                raise ValueError(f"cannot tie: {target_name or 'block'} has no parameter {name!r} to share")
            target_module._parameters[name] = parameter


def _give_own_parameters(block: nn.Module) -> dict[nn.Parameter, nn.Parameter]:
    """Replace every Parameter of `block` by a fresh copy of its current value (an untie).

    Returns `{fresh: copied_from}`.
    """
    copied_from = {}
    for module in block.modules():
        for name, parameter in module._parameters.items():
            if parameter is not None:
                fresh = nn.Parameter(parameter.detach().clone(), requires_grad=parameter.requires_grad)
                module._parameters[name] = fresh
                copied_from[fresh] = parameter
    return copied_from


class TiedBlocksMixin:
    """Adds cross-layer weight tying to a `PreTrainedModel` whose blocks live in an `nn.ModuleList`.

    Subclasses set `tied_blocks_path` (e.g. `"transformer.h"`) and a config class mixing in
    `TyingConfigMixin`. The map in `config.tying_map` is the single source of truth: it is applied
    whenever transformers ties weights (at construction and at the end of `from_pretrained`), and
    `retie` updates it together with the modules.
    """

    tied_blocks_path: str

    @property
    def tied_blocks(self) -> nn.ModuleList:
        return self.get_submodule(self.tied_blocks_path)

    @property
    def tying_map(self) -> TyingMap:
        return TyingMap(self.config.tying.entries, num_blocks=len(self.tied_blocks))

    def retie(self, new_map) -> RetieReport:
        """Apply `new_map` in place and report which Parameters appeared and which disappeared.

        Blocks that become independent get a fresh copy of the weights they used until now; blocks
        that become tied share their source's Parameters. Accepts a `TyingMap` or a list.
        """
        old_map = self.tying_map
        new_map = TyingMap(new_map, num_blocks=len(self.tied_blocks))
        before = {id(parameter): parameter for parameter in self.parameters()}
        copied_from = {}
        for block in new_map.independent_blocks:
            if not old_map.is_independent(block):
                copied_from.update(_give_own_parameters(self.tied_blocks[block]))
        self.config.tying_map = new_map.to_list()
        self._share_tied_blocks()
        self.all_tied_weights_keys = self.get_expanded_tied_weights_keys(all_submodels=True)
        after = {id(parameter): parameter for parameter in self.parameters()}
        return RetieReport(
            old_map=old_map,
            new_map=new_map,
            added=[parameter for key, parameter in after.items() if key not in before],
            removed=[parameter for key, parameter in before.items() if key not in after],
            copied_from=copied_from,
        )

    def _share_tied_blocks(self) -> None:
        blocks = self.tied_blocks
        for block, root in enumerate(self.tying_map):
            if root != block:
                _share_parameters(blocks[block], blocks[root])

    def tie_weights(self, missing_keys: set[str] | None = None, recompute_mapping: bool = True):
        # Share first: tied blocks of a plain (untied) checkpoint then take their source's weights,
        # and transformers' own tying sees the block pairs as already equal.
        self._share_tied_blocks()
        super().tie_weights(missing_keys=missing_keys, recompute_mapping=recompute_mapping)

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """The class's own ties (embeddings) plus the block ties, as escaped patterns.

        `save_pretrained` matches these with `re.search` to drop duplicates; escaping keeps
        `transformer.h.1.` from matching blocks 10 and 11.
        """
        block_keys = {re.escape(target): re.escape(source) for target, source in self._tied_block_parameter_names().items()}
        return {**(super()._tied_weights_keys or {}), **block_keys}

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """transformers' `{target: source}` names, plus one entry per Parameter of every tied block.

        Added even when `tie_word_embeddings=False`, where transformers would return `{}` and the
        block ties would be lost on load.
        """
        expanded = super().get_expanded_tied_weights_keys(all_submodels=all_submodels)
        if not all_submodels:
            expanded.update(self._tied_block_parameter_names())
        return expanded

    def _tied_block_parameter_names(self) -> dict[str, str]:
        names = {}
        blocks = self.tied_blocks
        for block, root in enumerate(self.tying_map):
            if root != block:
                for name, _ in blocks[root].named_parameters():
                    names[f"{self.tied_blocks_path}.{block}.{name}"] = f"{self.tied_blocks_path}.{root}.{name}"
        return names

    def _adjust_bias(self, output_embeddings, input_embeddings):
        # transformers resizes the bias of every tied target as if it were an output embedding; on
        # GPT-2's Conv1D this truncates `c_attn.bias`. Only the real output embedding needs it.
        if output_embeddings is self.get_output_embeddings():
            super()._adjust_bias(output_embeddings, input_embeddings)

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
