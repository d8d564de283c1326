"""Mistral causal language model whose decoder layers share Parameters according to `config.tying_map`."""

from transformers import MistralForCausalLM

from .configuration_tied_mistral import TiedMistralConfig
from .tied_blocks import TiedBlocksMixin


class TiedMistralForCausalLM(TiedBlocksMixin, MistralForCausalLM):
    """[`MistralForCausalLM`] tying its decoder layers `model.layers` by `config.tying_map` ([`TiedBlocksMixin`])."""

    config_class = TiedMistralConfig
    tied_blocks_path = "model.layers"


__all__ = ["TiedMistralForCausalLM"]
