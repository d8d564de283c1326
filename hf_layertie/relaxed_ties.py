"""Relaxed ties: a LoRA per block position on the shared weights, trained together with them.

Relaxed Recursive Transformers (Bae et al., ICLR 2025) convert a trained model by tying its layers and giving each
position a low-rank correction of its own: every position of a group computes with the group's shared weights plus
its LoRA, so positions that share weights need not compute the same function, at the cost of `r (in + out)`
parameters per adapted layer and position. Their LoRAs start from the truncated SVD of what each position loses by
the tie (its own trained weights minus the shared ones), which restores each position's trained weight matrices as far
as rank `r` allows (biases and norms, which get no LoRA, stay shared); the shared weights and the LoRAs are then trained together.

Here the adapters are PEFT's, added through transformers (`model.add_adapter`), so the model stays the tied
model (`TyingTrainer` and `retie` see it as before) and saves as a tied checkpoint with its adapters embedded
(`TiedBlocksMixin.save_pretrained`): `from_pretrained(folder)` loads both, and `to_untied()` merges each
position's adapters into its own weights for a plain export. `TyingTrainingArguments.lora_rank` adds them when the
strategy's map is applied (static, similarity): `--lora_rank` in the scripts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import warnings

import torch
import transformers
from torch import nn
from transformers.utils import ADAPTER_SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from .checks import check_choice, check_integer
from .models._compat import carries_integrated_adapters, declared_tied_weights
from .models.adapter_export import is_adapter_layer
from .models.tied_blocks import TiedBlocksMixin

LORA_INITS = ("svd", "zero")
ADAPTER_NAME = "default"
# transformers writes the adapter keys of a model with `add_adapter` with PEFT's prefix (`save_peft_format`).
_PEFT_PREFIX = "base_model.model."


def check_lora_settings(lora_rank, lora_init) -> None:
    """One error naming the setting: a rank below 1, an unknown init, an init without a rank, or a rank without PEFT
    (refused with the settings, not when the map is applied: `similarity` applies it after its warm-up)."""
    if lora_rank is None:
        if lora_init is not None:
            raise ValueError(f"lora_init={lora_init!r} needs lora_rank: relaxed ties are off without a rank")
        return
    check_integer("lora_rank", lora_rank, minimum=1)
    check_choice("lora_init", lora_init, LORA_INITS)
    _require_peft()


def _require_peft() -> None:
    """PEFT, at a version the installed transformers integrates (newer transformers refuse older PEFT only inside
    `add_adapter`, when the map is applied: after `similarity`'s warm-up)."""
    if importlib.util.find_spec("peft") is None:
        raise ImportError("lora_rank (relaxed ties) needs PEFT: pip install 'hf-layertie[peft]'")
    from packaging.version import Version
    from transformers.integrations import peft as peft_integration

    installed, needed = importlib.metadata.version("peft"), getattr(peft_integration, "MIN_PEFT_VERSION", "0")
    if Version(installed) < Version(needed):
        raise ImportError(
            f"lora_rank (relaxed ties) needs PEFT {needed} or newer with transformers {transformers.__version__}; "
            f"PEFT {installed} is installed: pip install 'hf-layertie[peft]'"
        )


def check_lora_rank(model: TiedBlocksMixin, lora_rank: int, num_distinct: int) -> None:
    """Refuse a rank at which relaxed ties cannot compress `model` once `num_distinct` of its blocks own weights.

    Two limits, both named: a rank at or above an adapted layer's smaller dimension lets each position replace the
    shared weight outright (the update `B @ A` has at most that rank, and with the SVD init the rows and columns
    beyond it stay zero and get no gradient), and a rank at which the relaxed blocks (the shared weights plus each
    position's LoRA) hold more parameters than the untied blocks gives up the saving relaxed ties are for. Measured
    on the blocks without adapters, so that a model resumed with its adapters in place gets the same answer.
    """
    block = model.tied_blocks[0]
    layers = _base_linear_layers(block)
    shapes = {name: layer.weight.shape for name, layer in layers.items()}
    smallest_name = min(shapes, key=lambda name: min(shapes[name]))
    smallest = min(shapes[smallest_name])
    positions = len(model.tied_blocks)
    adapter_parameters = {
        id(parameter)
        for layer in block.modules()
        if is_adapter_layer(layer)
        for name, parameter in layer.named_parameters()
        if not name.startswith("base_layer.")
    }
    block_parameters = sum(parameter.numel() for parameter in block.parameters() if id(parameter) not in adapter_parameters)
    per_rank = positions * sum(sum(shape) for shape in shapes.values())  # LoRA parameters of rank 1, all positions
    by_size = (positions - num_distinct) * block_parameters // per_rank
    if lora_rank < smallest and lora_rank <= by_size:
        return
    relaxed, untied = num_distinct * block_parameters + lora_rank * per_rank, positions * block_parameters
    largest = min(smallest - 1, by_size)
    advice = f"pass lora_rank={largest} or less" if largest >= 1 else "no rank fits: tie more blocks"
    raise ValueError(
        f"lora_rank={lora_rank} does not compress this model: ranks must stay below {smallest}, the smaller "
        f"dimension of its adapted layer {smallest_name} (the update has at most that rank), and at or below {by_size}, "
        f"above which the relaxed blocks ({num_distinct} of {positions} owning weights, plus a LoRA per position) "
        f"outgrow the untied ones (at this rank {relaxed:,} parameters against {untied:,}); {advice}"
    )


def relax_ties(
    model: TiedBlocksMixin,
    lora_rank: int,
    lora_init: str = "svd",
    weights_before: dict[int, dict[str, torch.Tensor]] | None = None,
) -> list[nn.Parameter]:
    """Add a LoRA of rank `lora_rank` to every linear layer of every block position; return its Parameters.

    The base weights keep the trainability they had (PEFT would freeze them: relaxed ties train them too). With
    `lora_init="svd"`, each position's LoRA starts from the rank-`lora_rank` truncated SVD of `weights_before[b]`
    (the weights block `b` computed with before its map was applied, by name within the block, as
    `TyingEngine.block_weights` gives them) minus the weights it shares now; a position whose weights did not
    change keeps PEFT's initialisation (zero update). `"zero"`: PEFT's initialisation everywhere, so the relaxed
    model starts as the tied one. `lora_alpha = lora_rank`: the update is `B @ A`, unscaled, at every rank.
    """
    check_lora_settings(lora_rank, lora_init)
    from peft import LoraConfig

    if lora_init == "svd" and weights_before is None:
        raise ValueError("lora_init='svd' needs weights_before: the weights each block used before its map was applied")
    if carries_integrated_adapters(model) or model.adapted_blocks():
        raise ValueError(
            "the model carries PEFT adapters already (a relaxed checkpoint, say): relaxed ties add their own to a model "
            "without any. Train it as it is, without lora_rank, or relax its plain export (to_untied()) again"
        )
    trainable = {parameter: parameter.requires_grad for parameter in model.parameters()}
    targets = _block_linear_modules(model)
    config = LoraConfig(
        r=lora_rank,
        lora_alpha=lora_rank,
        lora_dropout=0.0,
        target_modules=list(targets),
        fan_in_fan_out=any(type(module).__name__ == "Conv1D" for module in targets.values()),
    )
    with warnings.catch_warnings():  # the tied model's warning about merging shared weights: `to_untied` merges right
        warnings.filterwarnings("ignore", message="PEFT adapters were added")
        model.add_adapter(config, adapter_name=ADAPTER_NAME)
    for parameter, requires_grad in trainable.items():
        parameter.requires_grad_(requires_grad)
    if lora_init == "svd":
        _initialise_from_residuals(model, weights_before, lora_rank)
    return [parameter for parameter in model.parameters() if parameter not in trainable]


def _block_linear_modules(model: TiedBlocksMixin) -> dict[str, nn.Module]:
    """The linear layers (`nn.Linear`, GPT-2's `Conv1D`) inside the tied blocks, by full name: the adapted layers.
    Named one by one because PEFT's `"all-linear"` also takes heads outside the blocks (BERT's pooler)."""
    prefix = model.tied_blocks_path
    return {f"{prefix}.{name}": module for name, module in model.tied_blocks.named_modules() if _is_linear(module)}


def _base_linear_layers(block: nn.Module) -> dict[str, nn.Module]:
    """`block`'s linear layers as they are without adapters: a layer PEFT wraps counts as its base layer."""
    wrapped = [name for name, module in block.named_modules() if is_adapter_layer(module)]
    layers = {name: block.get_submodule(name).base_layer for name in wrapped}
    for name, module in block.named_modules():
        if _is_linear(module) and name not in wrapped and not any(name.startswith(f"{outer}.") for outer in wrapped):
            layers[name] = module
    return layers


def _is_linear(module: nn.Module) -> bool:
    """`nn.Linear` or GPT-2's `Conv1D` (which stores its weight as (in, out))."""
    return type(module).__name__ in ("Linear", "Conv1D")


@torch.no_grad()
def _initialise_from_residuals(model: TiedBlocksMixin, weights_before: dict, rank: int) -> None:
    for block, module in enumerate(model.tied_blocks):
        for name, layer in module.named_modules():
            if not is_adapter_layer(layer):
                continue
            shared = layer.base_layer.weight
            residual = weights_before[block][f"{name}.weight"].to(shared.device, torch.float32) - shared.float()
            if not residual.any():
                continue
            if layer.fan_in_fan_out:  # GPT-2's Conv1D stores (in, out); LoRA's `B @ A` is (out, in)
                residual = residual.T
            left, singular, right = torch.linalg.svd(residual, full_matrices=False)
            kept = min(rank, singular.numel())
            root = singular[:kept].sqrt() / layer.scaling[ADAPTER_NAME] ** 0.5
            lora_a, lora_b = layer.lora_A[ADAPTER_NAME].weight, layer.lora_B[ADAPTER_NAME].weight
            lora_a.zero_()
            lora_b.zero_()
            lora_a[:kept] = (root[:, None] * right[:kept]).to(lora_a.dtype)
            lora_b[:, :kept] = (left[:, :kept] * root).to(lora_b.dtype)


def holds_adapters(folder: str) -> bool:
    """Whether `folder` was saved from a model carrying adapters (`TiedBlocksMixin.save_pretrained` wrote them
    beside the tied base). A relaxed run's checkpoints saved before its map was applied (similarity's warm-up) hold
    none."""
    return os.path.isfile(os.path.join(folder, ADAPTER_SAFE_WEIGHTS_NAME))


def load_relaxed_weights(model: TiedBlocksMixin, folder: str) -> None:
    """Load a folder that `save_pretrained` wrote into `model`, which carries relaxed ties' adapters: the tied base
    and its adapters, as a relaxed run resumes from its checkpoint or loads its best one.

    A folder saved before the ties were relaxed (`holds_adapters` is false) holds the base alone: the adapters then
    start as a zero update, so that the model computes what the saved one did. The model must carry the folder's
    map already (the trainer re-ties to it first): weights are matched by name, and two maps with the same distinct
    blocks name the same weights.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    base_names = model.base_state_names(model.state_dict())
    actual_names = {base_name: name for name, base_name in base_names.items()}
    loaded = {}
    for file in _weight_files(folder):
        loaded.update({actual_names.get(key, key): value for key, value in load_file(file).items()})
    result = model.load_state_dict(loaded, strict=False)
    tied = set(declared_tied_weights(model))
    missing = [key for key in result.missing_keys if key in base_names and base_names[key] not in tied]
    if missing or result.unexpected_keys:
        raise ValueError(f"{folder} does not hold this model's base weights (missing {missing[:5]}, unexpected {result.unexpected_keys[:5]})")
    if not holds_adapters(folder):
        _zero_updates(model)
        return
    adapters = load_file(os.path.join(folder, ADAPTER_SAFE_WEIGHTS_NAME))
    adapters = {key.removeprefix(_PEFT_PREFIX): value for key, value in adapters.items()}
    result = set_peft_model_state_dict(model, adapters, adapter_name=ADAPTER_NAME)
    missing = [key for key in result.missing_keys if "lora_" in key]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{folder} does not hold this model's adapters (missing {missing[:5]}, unexpected {result.unexpected_keys[:5]})"
        )


@torch.no_grad()
def _zero_updates(model: TiedBlocksMixin) -> None:
    """Every LoRA's update `B @ A` zero, as PEFT initialises it: `B` zero, `A` kept so that `B` can learn."""
    for layer in model.tied_blocks.modules():
        if is_adapter_layer(layer):
            layer.lora_B[ADAPTER_NAME].weight.zero_()


def _weight_files(folder: str) -> list[str]:
    index = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        with open(index) as file:
            return [os.path.join(folder, name) for name in sorted(set(json.load(file)["weight_map"].values()))]
    single = os.path.join(folder, SAFE_WEIGHTS_NAME)
    if not os.path.isfile(single):
        raise FileNotFoundError(f"{folder} has no {SAFE_WEIGHTS_NAME} (nor its index): not a saved model with adapters")
    return [single]
