"""Configuration of a BERT whose encoder layers can share weights."""

from transformers import BertConfig

from .configuration_tying import TyingConfigMixin


class TiedBertConfig(TyingConfigMixin, BertConfig):
    r"""
    [`BertConfig`] with a tying map over the encoder layers `bert.encoder.layer`. Every BERT field keeps its
    meaning; two are added, `tying_map` and `tie_init` (documented in [`TyingConfigMixin`]).
    """

    model_type = "tied_bert"


__all__ = ["TiedBertConfig"]
