"""Every private transformers and torch API hf-layertie relies on, behind one guard checked at import.

transformers may rename or change its private names (`_tied_weights_keys`, `Trainer._save_checkpoint`, ...) in any
release, and the tied classes and `TyingTrainer` need some of them. Those the package calls or reads go through the
functions below; those it overrides cannot (a subclass overrides them by name) and are listed here instead
(`PRETRAINED_MODEL_PRIVATE_API`, `TRAINER_PRIVATE_API`). Importing this module checks that the installed
transformers is in the range all of them were verified against (`SUPPORTED_TRANSFORMERS`) and still has each name,
so that another version fails at once with one error naming the installed and the supported versions (or the API
that is gone), rather than misbehaving in silence or raising an AttributeError deep in a save.

The tied classes import this file relatively, so transformers copies it next to every checkpoint with them
(`register_for_auto_class`): a checkpoint loaded with `trust_remote_code=True` runs the same check under whatever
transformers the loader has. Like the other files of this folder it imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import inspect
from importlib import metadata

import torch
from packaging.specifiers import SpecifierSet
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import PreTrainedModel

# The transformers versions every private API below was verified against. setup.cfg's `install_requires` must say
# the same (tests/models/test_compat.py checks that they agree); widen both together, after running the suite on the new
# version.
SUPPORTED_TRANSFORMERS = ">=5.18,<6"

# `PreTrainedModel` internals the tied classes (`TiedBlocksMixin`, `AdapterExportMixin`) override, call or set,
# and what for. Each is checked on the class at import, except `all_tied_weights_keys`, which `post_init` sets on
# each model: the version range covers it.
PRETRAINED_MODEL_PRIVATE_API = {
    "_tied_weights_keys": "overridden: an entry per tied block, so that save_pretrained writes each shared tensor once",
    "get_expanded_tied_weights_keys": "overridden: the block ties without transformers' regex expansion",
    "tie_weights": "overridden: called with `missing_keys` at the end of from_pretrained, where tie groups get weights",
    "_adjust_bias": "overridden: only the output embedding's bias is resized (GPT-2's Conv1D biases are not)",
    "_hf_peft_config_loaded": "read and set: whether save_pretrained writes only the adapters or the whole model",
    "all_tied_weights_keys": "read and set: the ties transformers applies, brought in step with the map on a re-tie",
}
# `tie_weights`' arguments the override takes and passes on.
_TIE_WEIGHTS_PARAMETERS = ("missing_keys", "recompute_mapping")

# `Trainer` methods `TyingTrainer` overrides or calls: checked on the class when hf_layertie.trainer is imported
# (`check_trainer_private_api`), not here, so that loading a checkpoint does not import the Trainer.
TRAINER_PRIVATE_API = {
    "_save_checkpoint": "overridden: the tying state is written after the Trainer's checkpoint",
    "_load_from_checkpoint": "overridden: the model is re-tied to the checkpoint's map before its weights load",
    "_load_best_model": "overridden: the same for the best checkpoint",
    "_issue_warnings_after_load": "overridden: tied blocks, restored by sharing, are not reported missing",
    "_build_accelerator_args": "overridden: torch_compile compiles a tied model block by block (regional compilation)",
    "_get_output_dir": "called (`trainer_output_dir`): where `_save_checkpoint` writes",
    "_remove_unused_columns": "called (`remove_unused_columns`): the reward batches get the training columns",
    "_prepare_inputs": "called (`prepare_inputs`): the reward and similarity batches moved as training batches are",
    "_push_from_checkpoint": "called: `_save_checkpoint` pushes a checkpoint once its tying state is written",
}


def installed_transformers_version() -> str:
    """The version of the installed transformers distribution: what `SUPPORTED_TRANSFORMERS` is checked against, as
    pip checks setup.cfg's requirement. (Not `transformers.__version__`: transformers re-executes its `__init__`
    into a new module object while it imports some submodules, so that attribute is not one place to read.)"""
    return metadata.version("transformers")


def check_transformers_version() -> None:
    """Raise `ImportError` naming the installed and the supported versions when transformers is outside the range."""
    installed = installed_transformers_version()
    if not SpecifierSet(SUPPORTED_TRANSFORMERS).contains(installed, prereleases=True):
        raise ImportError(
            f"hf-layertie's tied models support transformers{SUPPORTED_TRANSFORMERS}, but transformers {installed} "
            f"is installed: they rely on private transformers APIs (listed in the tied models' _compat.py) that "
            f"change between versions. Install a supported version: pip install 'transformers{SUPPORTED_TRANSFORMERS}'"
        )


def _require(cls: type, api: dict[str, str], what: str) -> None:
    """Raise `ImportError` naming the first name of `api` that `cls` lacks: a rename within the supported range."""
    for name, use in api.items():
        if not hasattr(cls, name):
            raise ImportError(
                f"transformers {installed_transformers_version()} has no {cls.__name__}.{name}, which {what} relies on "
                f"({use}). hf-layertie supports transformers{SUPPORTED_TRANSFORMERS}; please report this version "
                f"as unsupported"
            )


def check_pretrained_model_private_api() -> None:
    """Raise `ImportError` naming the `PreTrainedModel` API the tied classes need that transformers lacks."""
    on_class = {name: use for name, use in PRETRAINED_MODEL_PRIVATE_API.items() if name != "all_tied_weights_keys"}
    _require(PreTrainedModel, on_class, "hf-layertie's tied models")
    accepted = inspect.signature(PreTrainedModel.tie_weights).parameters
    for name in _TIE_WEIGHTS_PARAMETERS:
        if name not in accepted:
            raise ImportError(
                f"transformers {installed_transformers_version()}'s PreTrainedModel.tie_weights takes no {name!r}, "
                f"which hf-layertie's tied models pass on ({PRETRAINED_MODEL_PRIVATE_API['tie_weights']}). hf-layertie "
                f"supports transformers{SUPPORTED_TRANSFORMERS}; please report this version as unsupported"
            )


def check_trainer_private_api(trainer_class: type) -> None:
    """Raise `ImportError` naming the private `Trainer` method `TyingTrainer` needs that `trainer_class` lacks."""
    _require(trainer_class, TRAINER_PRIVATE_API, "hf-layertie's TyingTrainer")


# transformers: the private state the tied classes read and set.


def declared_tied_weights(model: nn.Module) -> dict[str, str]:
    """transformers' `{target: source}` ties of `model` (`all_tied_weights_keys`); `{}` for a model without."""
    return getattr(model, "all_tied_weights_keys", {})


def declare_tied_weights(model: PreTrainedModel, ties: dict[str, str]) -> None:
    """Make `ties` the ties transformers applies and saves `model` by."""
    model.all_tied_weights_keys = ties


def carries_integrated_adapters(model: nn.Module) -> bool:
    """Whether adapters were added through transformers (`add_adapter`, `load_adapter`): transformers' own flag,
    which also switches `save_pretrained` to an adapter-only save."""
    return getattr(model, "_hf_peft_config_loaded", False)


@contextlib.contextmanager
def saving_whole_model(model: PreTrainedModel):
    """transformers' switch between an adapter-only save and a full one, set to the full one while inside. The key
    conversions `from_pretrained` recorded are set aside too: loading adapters records PEFT's, which drop the
    adapters' `base_model.model.` prefix, and a save reverses them, so the base would be written under prefixed names
    that no load reads. Without them the base is saved as a model that never loaded adapters saves it."""
    loaded, model._hf_peft_config_loaded = carries_integrated_adapters(model), False
    conversions = model.__dict__.pop("_weight_conversions", None)
    try:
        yield
    finally:
        model._hf_peft_config_loaded = loaded
        if conversions is not None:
            model._weight_conversions = conversions


# transformers: the private `Trainer` methods `TyingTrainer` calls (it takes the trainer as `trainer`).


def trainer_output_dir(trainer, trial) -> str:
    """The folder the Trainer writes `trial`'s checkpoints into."""
    return trainer._get_output_dir(trial)


def remove_unused_columns(trainer, dataset, description: str):
    """`dataset` without the columns the model's `forward` does not take, as the Trainer's own datasets are."""
    return trainer._remove_unused_columns(dataset, description=description)


def prepare_inputs(trainer, inputs: dict) -> dict:
    """`inputs` on the device (and in the form) the Trainer gives its training batches to the model."""
    return trainer._prepare_inputs(inputs)


# torch: `nn.Module`'s registries, read and written directly: their public iterators leave out `None` entries and
# children registered twice, which would name a block's weights differently from one block to another.


def own_parameters(module: nn.Module) -> dict[str, nn.Parameter | None]:
    """`module`'s own Parameters by name (not its children's), as registered: assigning an entry replaces it."""
    return module._parameters


def children(module: nn.Module) -> dict[str, nn.Module | None]:
    """`module`'s direct submodules by name, as registered."""
    return module._modules


def is_persistent_buffer(module: nn.Module, name: str) -> bool:
    """Whether `module`'s own buffer `name` is saved in its state dict."""
    return name not in module._non_persistent_buffers_set


# torch: `TorchDispatchMode` (a private module, `torch.utils._python_dispatch`), the base class of the mode that
# replays the random draws of the placeholders a lean construction builds (`lean_construction.py`).
DispatchMode = TorchDispatchMode


def is_fsdp_sharded(module: nn.Module) -> bool:
    """Whether FSDP2 (`fully_shard`) sharded `module`; False in a torch built without distributed support."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


check_transformers_version()
check_pretrained_model_private_api()
