"""Configuration of a Mistral whose decoder layers can share weights."""

from transformers import MistralConfig

from .tying_config import TyingConfigMixin


class TiedMistralConfig(TyingConfigMixin, MistralConfig):
    r"""
    [`MistralConfig`] with a tying map over the decoder layers `model.layers`. Every Mistral field keeps its
    meaning; two are added, `tying_map` and `tie_init` (documented in [`TyingConfigMixin`]).
    """

    model_type = "tied_mistral"

    tying_map: list | None = None
    tie_init: str = "root"


__all__ = ["TiedMistralConfig"]
