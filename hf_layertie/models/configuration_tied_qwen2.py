"""Configuration of a Qwen2 whose decoder layers can share weights."""

from transformers import Qwen2Config

from .configuration_tying import TyingConfigMixin


class TiedQwen2Config(TyingConfigMixin, Qwen2Config):
    r"""
    [`Qwen2Config`] with a tying map over the decoder layers `model.layers`. Every Qwen2 field keeps its meaning,
    `layer_types` too: a tied layer keeps its own position's attention type and sliding window, only its weights
    are shared. Two fields are added, `tying_map` and `tie_init` (documented in [`TyingConfigMixin`]).
    """

    model_type = "tied_qwen2"


__all__ = ["TiedQwen2Config"]
