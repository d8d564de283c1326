"""BERT masked language model whose encoder layers share Parameters according to `config.tying_map`."""

from transformers import BertForMaskedLM

from .configuration_tied_bert import TiedBertConfig
from .tied_blocks import TiedBlocksMixin


class TiedBertForMaskedLM(TiedBlocksMixin, BertForMaskedLM):
    """[`BertForMaskedLM`] with layers `bert.encoder.layer` tied by `config.tying_map` (see [`TiedBlocksMixin`])."""

    config_class = TiedBertConfig
    tied_blocks_path = "bert.encoder.layer"


__all__ = ["TiedBertForMaskedLM"]
