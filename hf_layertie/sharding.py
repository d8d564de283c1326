"""Sharding tied models with FSDP2 (`torch.distributed.fsdp.fully_shard`), and re-tying them while sharded.

Two facts decide the design (measured on torch 2.13, see docs/multi-process.md, "Sharding tied models (FSDP2)"):

- Under FSDP2 a Parameter must belong to exactly one FSDP group: blocks that share weights cannot each be sharded
  on their own ("Parameter ... is shared with a parameter already managed by another FSDP group"). So
  `shard_tied_model` shards each tie group's blocks together, in one `fully_shard` call, then the root.
- No engine follows a change of which Parameters are shared: a sharded model keeps computing with the groups it
  was sharded with, so `model.retie` on it raises. `retie_sharded` re-ties by a round trip: gather the full
  weights and optimizer state, build the model again, `retie` it, give each Parameter the optimizer state of the
  weights it continues (a fresh copy takes its source's, as `sync_optimizer_with_model` does on one process),
  shard it again and load the state into the same optimizer object (so a learning-rate scheduler keeps working).

Every process must call these functions at the same step with the same map: they are collective. `retie_sharded`
compares the map and the optimizer across processes before anything else, and raises on every process where they
disagree or do not fit, rather than leaving some processes blocked in a collective the others never enter. Under
gloo both first check that every process arrives (a monitored barrier): one that calls them alone raises, naming
the misuse, once `arrival_timeout` has passed, instead of blocking or ending in a bare gloo error.
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard

from .models._compat import declared_tied_weights
from .models.tied_blocks import TiedBlocksMixin
from .models.tying_map import TyingMap

logger = logging.getLogger(__name__)

_FULL = StateDictOptions(full_state_dict=True)
# How long the processes may reach a collective call here apart before the early ones stop waiting.
ARRIVAL_TIMEOUT = timedelta(minutes=5)


def shard_tied_model(model: TiedBlocksMixin, mesh=None, **fully_shard_kwargs) -> TiedBlocksMixin:
    """Shard `model` in place with FSDP2: one `fully_shard` per tie group (its blocks together), then the root.

    Args:
        model: any tied model (`TiedBlocksMixin`), not yet sharded.
        mesh: the `DeviceMesh` to shard over (`fully_shard`'s default, the world, when None).
        **fully_shard_kwargs: passed to every `fully_shard` call (`reshard_after_forward`, `mp_policy`, ...).

    Returns the same object, now an `FSDPModule`; `retie_sharded` changes its map.
    """
    if not isinstance(model, TiedBlocksMixin):
        raise TypeError(f"shard_tied_model needs a tied model (TiedBlocksMixin), got {type(model).__name__}")
    if isinstance(model, FSDPModule):
        raise ValueError(f"this {type(model).__name__} is sharded already; re-tie it with retie_sharded(model, optimizer, new_map)")
    adapted = model.adapted_blocks()
    if adapted:
        raise ValueError(
            f"blocks {sorted(adapted)} carry PEFT adapters (relaxed ties): shard_tied_model shards plain "
            "tied models only; train relaxed ties with DDP (accelerate launch --multi_gpu)"
        )
    unsharded_class = type(model)
    # `fully_shard` replaces every Parameter; remembered to recognize an optimizer built before sharding.
    replaced = {id(parameter): weakref.ref(parameter) for parameter in model.parameters()}
    blocks = model.tied_blocks
    for group in model.tying_map.groups().values():
        fully_shard([blocks[index] for index in group], mesh=mesh, **fully_shard_kwargs)
    fully_shard(model, mesh=mesh, **fully_shard_kwargs)
    # Kept on the module for `retie_sharded`, which builds the model again and shards it the same way.
    model._hf_layertie_sharding = {
        "class": unsharded_class,
        "mesh": mesh,
        "kwargs": dict(fully_shard_kwargs),
        "replaced": replaced,
    }
    handle = model.register_forward_pre_hook(lambda module, args: _warn_if_replaced_are_held(module, handle))
    return model


def _warn_if_replaced_are_held(model, handle) -> None:
    """At the first forward pass after sharding (once): the Parameters `fully_shard` replaced are freed unless
    something holds them, most likely an optimizer built before `shard_tied_model`, whose steps then change nothing
    (`retie_sharded` refuses it; a run that never re-ties would train nothing without a word)."""
    handle.remove()
    held = sum(reference() is not None for reference in model._hf_layertie_sharding["replaced"].values())
    if held:
        logger.warning(
            f"{held} Parameters that shard_tied_model replaced are still held, most likely by an optimizer built "
            f"before sharding: its steps change nothing in the sharded model. Build the optimizer after "
            f"shard_tied_model, over model.parameters()"
        )


def retie_sharded(
    model: TiedBlocksMixin,
    optimizer: torch.optim.Optimizer | None,
    new_map: TyingMap | Sequence[int],
    arrival_timeout: timedelta = ARRIVAL_TIMEOUT,
) -> TiedBlocksMixin:
    """Re-tie a model sharded by `shard_tied_model`; returns the new sharded model (use it from now on).

    `optimizer` (built on `model.parameters()`, or None) is kept as an object: its parameter groups are pointed
    at the new model's Parameters and its state is carried over by name, as `retie` and `sync_optimizer_with_model`
    do on one process: a Parameter that moved to another block keeps its state, a fresh copy of an untied block
    starts from its source's state and joins its source's group, state of Parameters that disappeared is dropped.
    Collective: every process calls it at the same step with the same map.

    Raises:
        ValueError: on every process, before any state is touched, when the processes asked for different maps
            (naming each), the map is invalid, or `optimizer` does not hold exactly `model`'s Parameters.
        RuntimeError: under gloo, when not every process called it within `arrival_timeout` (`_all_arrive`).
    """
    sharding = _sharding_of(model, "retie_sharded")
    _all_arrive("retie_sharded", arrival_timeout)
    new_map = _agreed_map(model, optimizer, new_map, sharding)
    weights = get_model_state_dict(model, options=_FULL)
    optimizer_state = None
    if optimizer is not None and optimizer.state:
        optimizer_state = get_optimizer_state_dict(model, optimizer, options=_FULL)
    elif optimizer is not None:
        # No state yet (before the first step): torch's state dicts would create it by a step of zero gradients,
        # which Adam counts (its bias correction then differs from one process's). Only the groups are carried.
        names = {id(parameter): name for name, parameter in model.named_parameters()}
        optimizer_state = {"state": {}, "param_groups": [{"params": [names[id(each)] for each in group["params"]]} for group in optimizer.param_groups]}  # fmt: skip

    replica = _unsharded_replica(model, sharding["class"], weights)
    old_names = {id(parameter): name for name, parameter in replica.named_parameters()}
    report = replica.retie(new_map)
    carried_from = {}  # new name -> the old name whose weights (and state) it continues
    for name, parameter in replica.named_parameters():
        source = report.copied_from.get(parameter, parameter)
        carried_from[name] = old_names[id(source)]

    sharded = shard_tied_model(replica, mesh=sharding["mesh"], **sharding["kwargs"])
    if optimizer is not None:
        _load_carried_optimizer_state(sharded, optimizer, optimizer_state, carried_from)
    return sharded


class ShardedRetie:
    """The re-tie policy of a `TyingEngine` driving a model sharded by `shard_tied_model`: each decision's map is
    applied by `retie_sharded` (`TyingEngine(..., retie=ShardedRetie())`).

    `retie_sharded` returns a new model: the engine makes it its `model`, so a loop reads `engine.model` after every
    decision (`model = engine.model` after `decide_if_due`); the optimizer object is kept, its state carried over.
    What `retie_sharded` does not do is refused, naming the setting (`check`): relaxed ties (`lora_rank`), a
    `tie_init` other than "root", and `untie_init="own"`.
    """

    # The settings a sharded re-tie serves at these values only (None: unset), and why.
    SERVED = {
        "lora_rank": (None, "relaxed ties add PEFT adapters, which shard_tied_model does not shard"),
        "tie_init": ("root", "retie_sharded starts each group from its root's weights"),
        "untie_init": ("source", "retie_sharded starts an untied block from its source's weights"),
    }

    def check(self, settings: dict) -> None:
        """Refuse (ValueError, naming it) a strategy setting among `settings` that a sharded re-tie cannot serve."""
        for name, (served, why) in self.SERVED.items():
            if settings.get(name, served) != served:
                raise ValueError(
                    f"{name}={settings[name]!r} cannot re-tie a model sharded with FSDP2 ({why}): leave {name} at "
                    f"{served!r}, or train with DDP"
                )

    def __call__(self, model: TiedBlocksMixin, optimizer: torch.optim.Optimizer | None, new_map: TyingMap) -> TiedBlocksMixin:
        """Re-tie `model` to `new_map` with `retie_sharded`, carrying `optimizer` along; returns the model to use."""
        return retie_sharded(model, optimizer, new_map)


def gather_tied_model(model: TiedBlocksMixin, arrival_timeout: timedelta = ARRIVAL_TIMEOUT) -> TiedBlocksMixin:
    """An unsharded copy of a model sharded by `shard_tied_model`, with its map and full weights, on every process
    (collective: under gloo, a RuntimeError names the misuse when not every process called it within
    `arrival_timeout`). Save it from one process: `gather_tied_model(model).save_pretrained(path)` writes a tied
    checkpoint that `from_pretrained` loads as usual."""
    sharding = _sharding_of(model, "gather_tied_model")
    _all_arrive("gather_tied_model", arrival_timeout)
    return _unsharded_replica(model, sharding["class"], get_model_state_dict(model, options=_FULL))


def _sharding_of(model, function: str) -> dict:
    sharding = getattr(model, "_hf_layertie_sharding", None)
    if sharding is None:
        raise ValueError(f"{function} needs a model sharded by hf_layertie.shard_tied_model, got an unsharded {type(model).__name__}")
    return sharding


def _all_arrive(function: str, timeout: timedelta) -> None:
    """Check that every process called `function` (collective) within `timeout` of each other: gloo's monitored
    barrier names the ranks that did not come, where the gathers that follow would block for the process group's
    timeout or fail with a bare connection error. Other backends have no monitored barrier: nothing is checked."""
    if dist.get_backend() != "gloo":
        return
    try:
        dist.monitored_barrier(timeout=timeout)
    except RuntimeError as error:
        raise RuntimeError(
            f"{function} is collective: every process sharing the model must call it at the same step, and not every "
            f"process did within {timeout.total_seconds():g} s ({error}). Call it on every process (save from one "
            f"process only after it returns)"
        ) from None


def _agreed_map(model, optimizer, new_map, sharding: dict) -> TyingMap:
    """`new_map`, once every process has shown it asked for the same valid map with a fitting optimizer.

    The collectives that follow depend on both: a process that raised alone would leave the others blocked, and
    processes that asked for different maps could each go on with their own. So each process's request is gathered
    first, and every process raises the same error.
    """
    local = {
        "asked": repr(new_map),
        "map": _requested_entries(new_map, len(model.tied_blocks)),
        "optimizer": _optimizer_mismatch(model, optimizer, sharding),
    }
    requests = _gathered(local, sharding["mesh"])
    if len({str(request["map"]) for request in requests.values()}) > 1:
        asked = ", ".join(f"rank {rank} asked for {request['asked']}" for rank, request in requests.items())
        raise ValueError(
            f"retie_sharded got different maps on different processes ({asked}): pass every process the same new_map"
        )
    entries = local["map"]
    if isinstance(entries, str):
        raise ValueError(entries)
    for rank, request in requests.items():
        if request["optimizer"] is not None:
            raise ValueError(f"retie_sharded's optimizer on rank {rank} {request['optimizer']}")
    return TyingMap(entries)


def _requested_entries(new_map, num_blocks: int) -> list[int] | str:
    """`new_map`'s canonical entries, or why it is not a map for this model (gathered, so not raised here)."""
    try:
        return TyingMap(new_map, num_blocks=num_blocks).to_list()
    except ValueError as error:
        return str(error)


def _optimizer_mismatch(model, optimizer, sharding: dict) -> str | None:
    """What is wrong with `optimizer`, or None: its state is carried over per Parameter of `model`, so it must hold
    exactly those, and FSDP2 replaced the Parameters an optimizer built before sharding holds (its steps change
    nothing)."""
    if optimizer is None:
        return None
    held = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    replaced = sharding["replaced"]
    if any(id(parameter) in replaced and replaced[id(parameter)]() is parameter for parameter in held):
        return (
            "was built before shard_tied_model, over Parameters that sharding replaced (its steps change nothing): "
            "build it after shard_tied_model, over model.parameters()"
        )
    own = {id(parameter) for parameter in model.parameters()}
    foreign = sum(id(parameter) not in own for parameter in held)
    if foreign or len(held) != len(own):
        return (
            f"holds {len(held) - foreign} of the model's {len(own)} Parameters and {foreign} of another model: "
            f"pass an optimizer built over model.parameters() after shard_tied_model"
        )
    return None


def _gathered(local: dict, mesh) -> dict[int, dict]:
    """`local` from every process sharing the model, by global rank: gathered along each dimension of `mesh` in turn
    (the world when None), each step passing on all that was gathered before, so every process receives them all."""
    known = {dist.get_rank(): local}
    for group in [None] if mesh is None else [mesh.get_group(dim) for dim in range(mesh.ndim)]:
        received = [None] * dist.get_world_size(group)
        dist.all_gather_object(received, known, group=group)
        known = {rank: request for part in received for rank, request in part.items()}
    return dict(sorted(known.items()))


def _unsharded_replica(model, unsharded_class: type, weights: dict) -> TiedBlocksMixin:
    """A plain (unsharded) copy of `model` with its current map, the gathered `weights`, its dtype and which of its
    Parameters train, on the weights' device. The weights name each shared Parameter once: only tied blocks' names
    may be missing, and anything else that does not fit is an error, not a weight left at its initialisation."""
    device = next(iter(weights.values())).device
    # Its initialisation is overwritten: it must not move the random generators (dropout would then differ from a
    # one-process `retie`, which draws nothing).
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        replica = unsharded_class(copy.deepcopy(model.config))
    kept = {name: (parameter.dtype, parameter.requires_grad) for name, parameter in model.named_parameters()}
    for name, parameter in replica.named_parameters():  # each shared Parameter once: its ties stay
        dtype, requires_grad = kept[name]
        parameter.data = parameter.data.to(dtype)
        parameter.requires_grad_(requires_grad)
    _carry_activation_checkpointing(model, replica)
    loaded = replica.load_state_dict(weights, strict=False)
    tied = declared_tied_weights(replica)
    missing = [key for key in loaded.missing_keys if key not in tied]
    if missing or loaded.unexpected_keys:
        raise RuntimeError(
            f"the gathered weights do not fit a {unsharded_class.__name__} with map {model.tying_map.render()}: "
            f"missing {missing}, unexpected {loaded.unexpected_keys}"
        )
    return replica.train(model.training)


def _carry_activation_checkpointing(model, replica) -> None:
    """The replica checkpoints the activations of the layers `model` does, with the same function (its kwargs,
    every_n_layers, offload): a re-tie must not bring back the memory that checkpointing saved."""
    modules = dict(model.named_modules())
    for name, module in replica.named_modules():
        for attribute in ("gradient_checkpointing", "_gradient_checkpointing_func"):
            if hasattr(modules[name], attribute):
                setattr(module, attribute, getattr(modules[name], attribute))
    if hasattr(model, "_require_grads_hook"):  # reentrant checkpointing needs inputs that require gradients
        replica.enable_input_require_grads()


def _load_carried_optimizer_state(model, optimizer, full_state: dict, carried_from: dict[str, str]) -> None:
    """Point `optimizer` at `model`'s Parameters, each in the group of the name it continues, and load the state
    of that name (by `set_optimizer_state_dict`, which shards it like the Parameters)."""
    group_of = {name: index for index, group in enumerate(full_state["param_groups"]) for name in group["params"]}
    parameters = dict(model.named_parameters())
    groups = [[] for _ in optimizer.param_groups]
    for name in parameters:
        groups[group_of[carried_from[name]]].append(name)
    for group, names in zip(optimizer.param_groups, groups):
        group["params"] = [parameters[name] for name in names]
    if not full_state["state"]:  # before the first step: nothing to carry, and none to create
        return
    optimizer.state.clear()
    state = {
        # A copy per name: an untied block and its source continue the same state, and must not share its tensors.
        "state": {
            name: {key: value.clone() if torch.is_tensor(value) else value for key, value in full_state["state"][carried_from[name]].items()}
            for name in parameters
            if carried_from[name] in full_state["state"]
        },
        "param_groups": [
            {**saved, "params": names} for saved, names in zip(full_state["param_groups"], groups)
        ],
    }
    set_optimizer_state_dict(model, optimizer, state, options=_FULL)
