"""Qwen2 causal language model whose decoder layers share Parameters according to `config.tying_map`."""

from transformers import Qwen2ForCausalLM

from .configuration_tied_qwen2 import TiedQwen2Config
from .tied_blocks import TiedBlocksMixin


class TiedQwen2ForCausalLM(TiedBlocksMixin, Qwen2ForCausalLM):
    """[`Qwen2ForCausalLM`] tying its decoder layers `model.layers` by `config.tying_map` ([`TiedBlocksMixin`])."""

    config_class = TiedQwen2Config
    tied_blocks_path = "model.layers"


__all__ = ["TiedQwen2ForCausalLM"]
