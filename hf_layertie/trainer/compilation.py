"""`torch_compile` for tied models: each block compiled on its own (regional compilation), once for all maps.

`torch.compile` of a whole tied model guards on which blocks hold the same Parameter objects (`h.0.mlp.c_fc.bias is
h.1.mlp.c_fc.bias`), so every new map recompiles the whole model, and after torch's recompile limit (8 graphs of one
function) new maps run uncompiled. A re-tie changes which Parameters a block holds, never what a block computes;
compiled on its own, a block takes its Parameters as graph inputs (dynamo inlines `nn.Module`s and lifts their
Parameters), so one graph serves every block under every map. That is accelerate's regional compilation
(`TorchDynamoPlugin(use_regional_compilation=True)`, `accelerate.utils.compile_regions`, as in torchtitan): the
blocks of the model's `ModuleList` and each module outside them are compiled separately, in a shallow copy of the
modules above them that holds the very same block objects. The Trainer's `model` stays the original, whose blocks
`retie` re-points, so the compiled copy computes with the new map at once.

transformers' Trainer trains without a KV cache (`TrainingArguments.use_cache`, False by default). With one, each
block position would compile a graph of its own (the cache's per-layer state differs from block to block), and blocks
past the recompile limit would run uncompiled: `compile_regionally` warns.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# accelerate's first release whose `TorchDynamoPlugin` takes `use_regional_compilation`.
REGIONAL_COMPILATION_ACCELERATE = "1.7.0"


def compile_regionally(dynamo_plugin, use_cache: bool) -> None:
    """Make accelerate's `dynamo_plugin` (the Trainer's, from `torch_compile`) compile each region on its own;
    `use_cache`, the Trainer's `TrainingArguments.use_cache`.

    Raises:
        ImportError: the installed accelerate has no regional compilation.
    """
    if dynamo_plugin is None or not hasattr(dynamo_plugin, "use_regional_compilation"):
        raise ImportError(
            f"torch_compile on a tied model compiles each block on its own (accelerate's regional compilation), so "
            f"that a re-tie does not recompile the model; it needs accelerate>={REGIONAL_COMPILATION_ACCELERATE}: "
            f"pip install 'accelerate>={REGIONAL_COMPILATION_ACCELERATE}', or leave torch_compile off"
        )
    dynamo_plugin.use_regional_compilation = True
    if use_cache:
        logger.warning(
            "torch_compile with use_cache=True: the KV cache built in every training forward makes each block position "
            "compile a graph of its own, and blocks past torch's recompile limit (8) run uncompiled; leave use_cache off"
        )
