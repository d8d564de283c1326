"""Configuration of a Mistral whose decoder layers can share weights."""

from transformers import MistralConfig

from .configuration_tying import TyingConfigMixin


class TiedMistralConfig(TyingConfigMixin, MistralConfig):
    r"""
    [`MistralConfig`] with a tying map over the decoder layers `model.layers`. Every Mistral field keeps its
    meaning; two are added, `tying_map` and `tie_init` (documented in [`TyingConfigMixin`]).
    """

    model_type = "tied_mistral"


__all__ = ["TiedMistralConfig"]
