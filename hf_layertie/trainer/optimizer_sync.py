"""Keep the optimizer and the DDP wrapper in step with the model after a re-tie.

transformers' Trainer builds both once, from the Parameters that exist at the start. A re-tie
removes Parameters (a block joins another's weights) and creates new ones (a block is untied into
a fresh copy); without these two functions the removed ones would keep their Adam state alive and
the new ones would never be trained (optimizer) or never be synchronised across ranks (DDP).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..models.tied_blocks import RetieReport


def sync_optimizer_with_model(optimizer: torch.optim.Optimizer, model: nn.Module, report: RetieReport) -> None:
    """Make `optimizer` hold exactly the model's distinct trainable Parameters, in `named_parameters()` order.

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
    _regroup(optimizer, model, group_of)


def add_to_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module, added: list[nn.Parameter], like: nn.Parameter) -> None:
    """Put new Parameters (adapters added mid-run) into the param group of `like`, without state, keeping the
    groups in `named_parameters()` order as `sync_optimizer_with_model` does."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    group_of = {parameter: index for index, group in enumerate(optimizer.param_groups) for parameter in group["params"]}
    group_of.update(dict.fromkeys(added, group_of[like]))
    _regroup(optimizer, model, group_of)


def _regroup(optimizer: torch.optim.Optimizer, model: nn.Module, group_of: dict[nn.Parameter, int]) -> None:
    parameters = [parameter for _, parameter in model.named_parameters()]
    for index, group in enumerate(optimizer.param_groups):
        group["params"] = [parameter for parameter in parameters if group_of.get(parameter) == index]


def rebuild_data_parallel(wrapper: nn.Module) -> None:
    """Re-initialise a DDP wrapper in place so that it covers exactly the module's current Parameters.

    DDP all-reduces only the Parameters that existed when it was built, and its reducer keeps references
    to them. Rebuilding the SAME wrapper object (rather than creating a second one) matters because the
    Trainer's loop, accelerate and the Trainer all hold references to it: they keep working, and the old
    reducer, with its references to removed Parameters, is released. Construction broadcasts rank 0's
    weights, so every rank continues from identical Parameters. Collective: call on every rank, at the
    same step, with the same map.
    """
    if not isinstance(wrapper, DistributedDataParallel):
        return
    DistributedDataParallel.__init__(
        wrapper,
        wrapper.module,
        device_ids=wrapper.device_ids,
        output_device=wrapper.output_device,
        broadcast_buffers=wrapper.broadcast_buffers,
        process_group=wrapper.process_group,
        bucket_cap_mb=wrapper.bucket_bytes_cap / (1024 * 1024),
        find_unused_parameters=wrapper.find_unused_parameters,
        gradient_as_bucket_view=wrapper.gradient_as_bucket_view,
        static_graph=wrapper.static_graph,
    )
