"""Building a tied model from its config with only its distinct blocks in memory.

`TiedGPT2LMHeadModel(config)` with a map runs transformers' constructor and weight initialisation unchanged, with
two differences while it runs:

- the Parameters of every tied position (a block `i` with `tying_map[i] != i`) are swapped for meta-device
  placeholders the moment they are registered, before anything writes them: the constructor's own `torch.empty`
  is never written and is freed at once, so no tied block is ever materialised or initialised;
- every random draw that initialises a placeholder (at construction or in transformers' `_init_weights`) is drawn
  on a scratch tensor of the same shape, strides and dtype on the device the Parameter was created on (a view of
  one buffer, as large as the largest Parameter, kept until the construction ends).

The random generator therefore advances exactly as when every block was materialised and initialised: each owner's
weights, and everything built after the blocks, are bit-identical to a build that materialises every block, for the
same seed (so are the generator's states afterwards). Buffers are built as usual (a block's buffers may depend on
its position). transformers' tie at the end of construction then points each tied position at its owner's
Parameters (`TiedBlocksMixin.__init__` does it again, in case the tie was skipped, and checks that no placeholder is
left). The peak is the distinct blocks plus one Parameter of scratch.

The tied positions are recognised by counting the instances of the block class the constructor builds: the k-th is
position k. The block class is found once per tied class by building the plain class on the meta device (nothing is
allocated nor drawn). `check_order` checks that the k-th instance is the block at position k and raises otherwise (a
class that builds its blocks in another order: set `lean_construction = False` on it to build every block).

Not used (every block is built, as by transformers) when nothing is tied, when the model is built on the meta device
(`from_pretrained`, which loads each distinct block once anyway, or accelerate's `init_empty_weights`) and under
DeepSpeed ZeRO-3 (which partitions Parameters as they are registered).

Like the other files of this folder it only uses relative imports: it is copied next to checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading

import torch
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook

from ._compat import DispatchMode

# The block class of each tied class (None: its blocks are not all of one class), found by `block_class`.
_BLOCK_CLASSES: dict[type, type | None] = {}
# One lean construction at a time: the block class's `__init__` is wrapped while it runs (other threads building
# the same class meanwhile get the unwrapped behaviour, which the wrapper checks per thread).
_LOCK = threading.Lock()
_THREAD = threading.local()


def block_class(model_class: type, config) -> type | None:
    """The class of `model_class`'s tied blocks, found by building the plain class on the meta device."""
    if model_class not in _BLOCK_CLASSES:
        with torch.device("meta"):  # transformers skips weight initialisation on meta; meta draws use no generator
            probe = model_class.untied_class()(copy.deepcopy(config))
        classes = {type(block) for block in probe.get_submodule(model_class.tied_blocks_path)}
        _BLOCK_CLASSES[model_class] = classes.pop() if len(classes) == 1 else None
    return _BLOCK_CLASSES[model_class]


def _parameters_redirected() -> bool:
    """Whether another tool already redirects Parameter registration (accelerate's `init_empty_weights` puts every
    Parameter on the meta device that way): the model then holds no weights to spare, and random draws on its meta
    Parameters must stay free."""
    return getattr(nn.Module.register_parameter, "__module__", None) != nn.Module.__module__


def _deepspeed_zero3() -> bool:
    try:
        from transformers.integrations import is_deepspeed_zero3_enabled
    except ImportError:  # pragma: no cover (transformers always has it)
        return False
    return is_deepspeed_zero3_enabled()


class LeanConstruction:
    """The block instances one lean construction built, in order, and where it swapped Parameters for placeholders."""

    def __init__(self, tying_map: list[int]):
        self.tying_map = tying_map
        self.built: list[nn.Module] = []
        self.placeholder_depth = 0  # > 0 while a tied position's constructor runs
        self.device: torch.device | None = None  # where the Parameters swapped for placeholders were created

    def build_block(self, block: nn.Module, construct) -> None:
        position = len(self.built)
        self.built.append(block)
        tied = position < len(self.tying_map) and self.tying_map[position] != position
        self.placeholder_depth += tied
        try:
            construct()
        finally:
            self.placeholder_depth -= tied

    def placeholder_for(self, parameter: nn.Parameter) -> nn.Parameter | None:
        """The meta placeholder registered instead of `parameter` (None: register `parameter` itself)."""
        if self.placeholder_depth == 0 or type(parameter) is not nn.Parameter or parameter.is_meta:
            return None
        self.device = parameter.device
        with torch.no_grad():
            placeholder = torch.empty_like(parameter, device="meta")
        return nn.Parameter(placeholder, requires_grad=parameter.requires_grad)

    def check_order(self, model) -> None:
        """Raise unless the k-th block built is the block at position k (so the placeholders went to tied ones)."""
        blocks = model.tied_blocks
        if self.built[: len(blocks)] != list(blocks):
            raise RuntimeError(
                f"{type(model).__name__} built its {type(blocks[0]).__name__} blocks in another order than they "
                f"sit in {model.tied_blocks_path}, so the blocks built without weights may not be the tied ones: "
                f"{_OPT_OUT}"
            )

    @staticmethod
    def check_no_placeholder_left(model) -> None:
        left = [name for name, parameter in model.named_parameters(remove_duplicate=False) if parameter.is_meta]
        if left:
            raise RuntimeError(
                f"building {type(model).__name__} left Parameters without storage ({', '.join(left[:3])}, ...): "
                f"{_OPT_OUT}"
            )


_OPT_OUT = "set `lean_construction = False` on the class to build every block before tying them"


class _ReplayRandomDraws(DispatchMode):
    """Each random op that writes a meta placeholder is also run on a scratch tensor of the same shape, strides and
    dtype on the device the placeholder's Parameter was created on, so that the generator advances as it would have.

    The scratch tensors are views of one buffer, kept for the whole construction and grown to the largest: freeing
    a scratch tensor per draw would leave its written pages resident in the allocator's free lists (fragmented by
    the small allocations in between), and the peak would grow by one block per tied position after all.
    """

    def __init__(self, construction: LeanConstruction):
        super().__init__()
        self.construction = construction
        self.buffer: torch.Tensor | None = None

    def scratch(self, like: torch.Tensor, device: torch.device) -> torch.Tensor:
        span = 1 + sum((size - 1) * stride for size, stride in zip(like.size(), like.stride()) if size > 0)
        nbytes = span * like.element_size() if like.numel() > 0 else 0
        if self.buffer is None or self.buffer.device != device or self.buffer.numel() < nbytes:
            self.buffer = None
            self.buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
        return self.buffer[:nbytes].view(like.dtype).as_strided(like.size(), like.stride())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = self.construction.device
        if device is not None and torch.Tag.nondeterministic_seeded in func.tags:
            written = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if written is not None and written.is_meta:  # `normal_(placeholder)` and the like
                func(self.scratch(written, device), *args[1:], **kwargs)
                alias = func._schema.arguments[0].alias_info
                if alias is not None and alias.is_write:  # in place: on meta it only returns its argument (and
                    return written  # would take torch's Python reference implementation, about 1 ms a call)
            elif written is None and torch.device(kwargs.get("device") or "cpu").type == "meta":
                # a factory such as `randn(..., device=placeholder.device)`
                func(*args, **{**kwargs, "device": device})
        return func(*args, **kwargs)


@contextlib.contextmanager
def _wrapped_init(cls: type):
    """`cls.__init__` hands each instance built in this thread during a lean construction to it (`build_block`)."""
    had_own = "__init__" in cls.__dict__
    original = cls.__dict__.get("__init__")
    inherited = cls.__init__

    @functools.wraps(inherited)
    def __init__(self, *args, **kwargs):
        construction = getattr(_THREAD, "construction", None)
        if construction is None or type(self) is not cls:
            return inherited(self, *args, **kwargs)
        construction.build_block(self, lambda: inherited(self, *args, **kwargs))

    cls.__init__ = __init__
    try:
        yield
    finally:
        if had_own:
            cls.__init__ = original
        else:
            del cls.__init__


@contextlib.contextmanager
def distinct_blocks_only(model_class: type, config):
    """Around the transformers constructor of a tied class: yields the `LeanConstruction` whose checks the built model
    then passes, or None where every block is built as transformers builds it (see the module's docstring)."""
    tying_map = config.tying_map
    if (
        tying_map is None
        or all(root == position for position, root in enumerate(tying_map))
        or not getattr(model_class, "lean_construction", True)
        or torch.get_default_device().type == "meta"
        or _parameters_redirected()
        or _deepspeed_zero3()
        or getattr(_THREAD, "construction", None) is not None
    ):
        yield None
        return
    blocks_class = block_class(model_class, config)
    if blocks_class is None:
        yield None
        return
    construction = LeanConstruction(list(tying_map))

    def swap(module, name, parameter):  # a global hook: Parameters registered by other threads are left alone
        if getattr(_THREAD, "construction", None) is not construction:
            return None
        return construction.placeholder_for(parameter)

    with _LOCK, _wrapped_init(blocks_class):
        hook = register_module_parameter_registration_hook(swap)
        _THREAD.construction = construction
        try:
            with _ReplayRandomDraws(construction):
                yield construction
        finally:
            _THREAD.construction = None
            hook.remove()
