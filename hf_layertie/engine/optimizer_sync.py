"""Keep the optimizer and the DDP wrapper in step with the model after a re-tie.

transformers' Trainer builds both once, from the Parameters that exist at the start. A re-tie
removes Parameters (a block joins another's weights) and creates new ones (a block is untied into
a fresh copy); without these two functions the removed ones would keep their Adam state alive and
the new ones would never be trained (optimizer) or never be synchronised across ranks (DDP).
"""

from __future__ import annotations

import copy
import inspect
import warnings

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..models.tying_map import RetieReport
from .block_learning_rates import group_by_block_uses


def sync_optimizer_with_model(optimizer: torch.optim.Optimizer, model: nn.Module, report: RetieReport) -> None:
    """Make `optimizer` hold the model's distinct trainable Parameters, in `named_parameters()` order, and after
    them in each group those it holds from outside the model (a learnable loss weight), in their order (moved to
    the group's end: every sitting does so alike before an `optimizer.pt` loads).

    - Parameters that disappeared are dropped with their state (the memory is freed).
    - A fresh Parameter of an untied block joins the param group of the Parameter it was copied from and
      starts from a copy of that Parameter's state (Adam moments and step count): its weights continue
      from the shared weights, so its update statistics continue too, instead of restarting with a
      bias-corrected first step of full learning-rate size.
    - A fresh Parameter that is the mean of several (`retie(..., tie_init="mean")`) joins the group of the first
      of them and starts without state: its weights are new, so are its update statistics.
    - Groups keep `named_parameters()` order, so a saved `optimizer.pt` reloads onto the right tensors.
    - Groups are edited in place: the learning-rate schedule and fused/foreach kernels keep working.
    """
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the torch one
    group_of = {parameter: index for index, group in enumerate(optimizer.param_groups) for parameter in group["params"]}
    for fresh, source in report.copied_from.items():
        if source not in group_of:
            continue  # a frozen source stays frozen in its copy
        group_of[fresh] = group_of[source]
        if source in optimizer.state:
            optimizer.state[fresh] = {
                key: value.clone() if torch.is_tensor(value) else copy.deepcopy(value)
                for key, value in optimizer.state[source].items()
            }
    for fresh, sources in report.averaged_from.items():
        if sources[0] in group_of:
            group_of[fresh] = group_of[sources[0]]
    for parameter in report.removed:
        optimizer.state.pop(parameter, None)
    _regroup(optimizer, model, group_of, dropped=set(report.removed))


def add_to_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module, added: list[nn.Parameter], like: nn.Parameter) -> None:
    """Put new Parameters (adapters added mid-run) into the param group of `like`, without state, keeping the
    groups in `named_parameters()` order as `sync_optimizer_with_model` does."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    group_of = {parameter: index for index, group in enumerate(optimizer.param_groups) for parameter in group["params"]}
    group_of.update(dict.fromkeys(added, group_of[like]))
    _regroup(optimizer, model, group_of)


def _regroup(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    group_of: dict[nn.Parameter, int],
    dropped: set[nn.Parameter] = frozenset(),
) -> None:
    """Each group's model Parameters in `named_parameters()` order, then those it holds from outside the model (a
    learnable loss weight, say) as they were; `dropped` (what a re-tie removed from the model) leaves. Under
    `loop_lr_exponent` each goes to the sibling group of its block's new use count (`group_by_block_uses`)."""
    group_by_block_uses(optimizer, model, group_of)
    parameters = [parameter for _, parameter in model.named_parameters()]
    known = set(parameters) | dropped
    for index, group in enumerate(optimizer.param_groups):
        outside = [parameter for parameter in group["params"] if parameter not in known]
        group["params"] = [parameter for parameter in parameters if group_of.get(parameter) == index] + outside


# Arguments of `DistributedDataParallel.__init__` that a rebuild carries over (or refuses, see
# `data_parallel_rebuild_problems`). An argument a later torch adds is refused until it is handled here, rather than
# silently reset to its default by a rebuild.
_HANDLED_ARGUMENTS = frozenset(
    {
        "self", "module", "device_ids", "output_device", "dim", "broadcast_buffers", "forward_sync_buffers",
        "init_sync", "process_group", "device_mesh", "bucket_cap_mb", "bucket_cap_mb_list", "find_unused_parameters",
        "check_reduction", "gradient_as_bucket_view", "static_graph", "skip_all_reduce_unused_params",
        "batched_grad_copy", "mixed_precision", "delay_all_reduce_named_params", "param_to_hook_all_reduce",
    }
)  # fmt: skip
# What `nn.Module.__init__` resets and DDP's constructor does not rebuild: the wrapper's own hooks (forward, backward,
# state_dict, ...) and its train/eval mode. `_parameters`, `_buffers` and `_modules` are DDP's to rebuild.
_MODULE_STATE = tuple(sorted(set(vars(nn.Module())) - {"_parameters", "_buffers", "_non_persistent_buffers_set", "_modules"}))
# Runtime state of the wrapper that its constructor resets: `no_sync()`'s flag (a re-tie can fall inside a gradient
# accumulation window), `_set_ddp_sink_clone`'s choice and a `join()` context's configuration.
_RUNTIME_STATE = ("require_backward_grad_sync", "_ddp_sink_clone", "_join_config")
_MB = 1024 * 1024  # torch's _MB_TO_BYTES


def data_parallel_rebuild_problems(wrapper: nn.Module) -> list[str]:
    """The settings of a DDP wrapper that `rebuild_data_parallel` cannot carry over, each named with the reason."""
    if not isinstance(wrapper, DistributedDataParallel):
        return []
    problems = []
    added = sorted(set(inspect.signature(DistributedDataParallel.__init__).parameters) - _HANDLED_ARGUMENTS)
    if added:
        problems.append(
            f"DistributedDataParallel arguments of torch {torch.__version__} that hf_layertie does not know how to "
            f"carry over yet ({', '.join(added)})"
        )
    if getattr(wrapper, "mixed_precision", None) is not None:
        problems.append(
            "mixed_precision (DDP's _MixedPrecision: its construction adds low-precision copies of the Parameters and "
            "forward pre-hooks on every submodule; a rebuild would stack them)"
        )
    if getattr(wrapper, "_delay_all_reduce_params", None):
        problems.append(
            "delay_all_reduce_named_params / param_to_hook_all_reduce (hooks on the Parameters named at construction; a "
            "re-tie replaces Parameters)"
        )
    mesh = getattr(wrapper, "device_mesh", None)
    if mesh is not None and getattr(mesh, "_get_root_mesh", lambda: mesh)() != mesh:
        problems.append(
            "a device_mesh sliced from a larger mesh (DDP with tensor parallelism: construction adds DTensor hooks on "
            "the model; a rebuild would stack them)"
        )
    if getattr(wrapper, "_use_python_reducer", False):
        problems.append(
            "torch._dynamo's python_reducer mode of DDP (construction adds post-accumulate-grad hooks on the "
            "Parameters; a rebuild would stack them)"
        )
    if any(hasattr(parameter, "_in_backward_optimizers") for parameter in wrapper.module.parameters()) or any(
        hook.__module__.endswith("optimizer_overlap_hooks") for hook, _ in getattr(wrapper, "_comm_hooks", [])
    ):
        problems.append(
            "an optimizer run in the backward pass (apply_optimizer_in_backward, DDP._register_fused_optim): it was "
            "built over the Parameters a re-tie replaces"
        )
    if any(type(state).__name__ == "PowerSGDState" for _, state in getattr(wrapper, "_comm_hooks", [])):
        problems.append(
            "a PowerSGD communication hook (powerSGD_hook / batched_powerSGD_hook, e.g. accelerate's "
            "DDPCommunicationHookType.POWER_SGD): its error-feedback and warm-start memories are kept per gradient "
            "bucket, and a re-tie changes the buckets"
        )
    return problems


def check_data_parallel_can_rebuild(wrapper: nn.Module) -> None:
    """Refuse, naming them, the DDP settings that `rebuild_data_parallel` cannot carry over: call it before training
    starts with the wrapper the run will re-tie under (the Trainer builds it in `train`, not in its constructor)."""
    problems = data_parallel_rebuild_problems(wrapper)
    if problems:
        raise ValueError(
            "Re-ties rebuild the DistributedDataParallel wrapper, and these of its settings cannot survive a rebuild: "
            + "; ".join(problems)
            + ". Remove them, or train with a fixed tying map (tying_strategy='none' or 'static')."
        )


def _construction_arguments(wrapper: DistributedDataParallel) -> dict:
    """The arguments that rebuild `wrapper` as it was built, read back from what its constructor stored."""
    arguments = {
        "device_ids": wrapper.device_ids,
        "output_device": wrapper.output_device,
        "dim": wrapper.dim,
        "find_unused_parameters": wrapper.find_unused_parameters,
        "gradient_as_bucket_view": wrapper.gradient_as_bucket_view,
        "static_graph": wrapper.static_graph,
    }
    for name in ("skip_all_reduce_unused_params", "batched_grad_copy"):
        if hasattr(wrapper, name):
            arguments[name] = getattr(wrapper, name)
    if getattr(wrapper, "device_mesh", None) is not None:
        arguments["device_mesh"] = wrapper.device_mesh  # DDP refuses a process_group next to a device_mesh
    else:
        arguments["process_group"] = wrapper.process_group
    if hasattr(wrapper, "forward_sync_buffers"):  # torch >= 2.13
        # `forward_sync_buffers=False` would still broadcast buffers at construction; only the deprecated
        # `broadcast_buffers=False` keeps rank-local buffers rank-local, as they were before the re-tie.
        if wrapper.forward_sync_buffers:
            arguments["forward_sync_buffers"] = True
        else:
            arguments["broadcast_buffers"] = False
    else:
        arguments["broadcast_buffers"] = wrapper.broadcast_buffers
    if getattr(wrapper, "bucket_bytes_cap_list", None):
        arguments["bucket_cap_mb_list"] = [cap / _MB for cap in wrapper.bucket_bytes_cap_list]  # exact: _MB is 2**20
    elif not getattr(wrapper, "bucket_bytes_cap_default", False):
        arguments["bucket_cap_mb"] = wrapper.bucket_bytes_cap / _MB
    # else: bucket_cap_mb was left unset, which also gives the first bucket its small default cap: leave it unset.
    return arguments


def _builtin_comm_hook(wrapper: DistributedDataParallel):
    """The C++ communication hook registered with `_register_builtin_comm_hook` (kept by the reducer only), or None."""
    name = wrapper._get_ddp_logging_data().get("comm_hook", "") if wrapper.logger is not None else ""
    prefix = "BuiltinCommHookType."
    if name.startswith(prefix):
        return torch.distributed.BuiltinCommHookType.__members__[name[len(prefix) :]]
    return None


def rebuild_data_parallel(wrapper: nn.Module) -> None:
    """Re-initialise a DDP wrapper in place so that it covers exactly the module's current Parameters.

    DDP all-reduces only the Parameters that existed when it was built, and its reducer keeps references
    to them. Rebuilding the SAME wrapper object (rather than creating a second one) matters because the
    Trainer's loop, accelerate and the Trainer all hold references to it: they keep working, and the old
    reducer, with its references to removed Parameters, is released. Construction broadcasts rank 0's
    weights, so every rank continues from identical Parameters. Collective: call on every rank, at the
    same step, with the same map.

    Everything the wrapper was set up with survives:
    - every construction argument, read back from the attributes the constructor stored (`_construction_arguments`):
      bucket caps (per-bucket list, or the unset default with its small first bucket), buffer synchronisation,
      `skip_all_reduce_unused_params`, `device_mesh`, ...;
    - the registered communication hook with its state object (`register_comm_hook`: accelerate's fp16/bf16 hooks
      and wrappers, a user's), or the C++ one of `_register_builtin_comm_hook`;
    - the hooks on the wrapper itself and its train/eval mode, which `nn.Module.__init__` would reset;
    - `no_sync()`'s flag, `_set_ddp_sink_clone` and a `join()` context's configuration.
    Settings that cannot survive (`data_parallel_rebuild_problems`) are refused before anything changes.

    Why re-run the constructor rather than rebuild only the reducer: the constructor is torch's one maintained
    recipe for a reducer (shape verification, broadcast, bucket assignment, logger, static graph, SyncBatchNorm
    handle), and its private helpers change signature and order between releases (2.13 moved bucket sizes into
    `_BucketCapacityConfig`). Re-running it and putting back the few things it resets depends only on its
    arguments, which `_HANDLED_ARGUMENTS` checks against the installed signature, and on `nn.Module`'s state names,
    taken from a bare `nn.Module()`. What is lost is DDP's runtime logging (sample rate, iteration statistics) and
    metadata set on the old reducer by private calls (`_set_sparse_metadata`).
    """
    if not isinstance(wrapper, DistributedDataParallel):
        return
    check_data_parallel_can_rebuild(wrapper)
    arguments = _construction_arguments(wrapper)
    comm_hooks = list(getattr(wrapper, "_comm_hooks", []))
    builtin_hook = None if comm_hooks else _builtin_comm_hook(wrapper)
    kept = {name: wrapper.__dict__[name] for name in (*_MODULE_STATE, *_RUNTIME_STATE) if name in wrapper.__dict__}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
        DistributedDataParallel.__init__(wrapper, wrapper.module, **arguments)
    wrapper.__dict__.update(kept)
    if not getattr(wrapper, "_comm_hooks", []):  # (a hook the constructor registered itself would be refused above)
        for hook, state in comm_hooks:
            wrapper.register_comm_hook(state, hook)
        if builtin_hook is not None:
            wrapper._register_builtin_comm_hook(builtin_hook)
