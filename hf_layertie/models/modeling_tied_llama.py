"""Llama causal language model whose decoder layers share Parameters according to `config.tying_map`."""

from transformers import LlamaForCausalLM

from .configuration_tied_llama import TiedLlamaConfig
from .tied_blocks import TiedBlocksMixin


class TiedLlamaForCausalLM(TiedBlocksMixin, LlamaForCausalLM):
    """[`LlamaForCausalLM`] tying its decoder layers `model.layers` by `config.tying_map` ([`TiedBlocksMixin`])."""

    config_class = TiedLlamaConfig
    tied_blocks_path = "model.layers"


__all__ = ["TiedLlamaForCausalLM"]
