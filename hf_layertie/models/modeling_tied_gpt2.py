"""GPT-2 language model whose transformer blocks share Parameters according to `config.tying_map`."""

from transformers import GPT2LMHeadModel

from .configuration_tied_gpt2 import TiedGPT2Config
from .tied_blocks import TiedBlocksMixin


class TiedGPT2LMHeadModel(TiedBlocksMixin, GPT2LMHeadModel):
    """[`GPT2LMHeadModel`] with blocks `transformer.h` tied by `config.tying_map` (see [`TiedBlocksMixin`]).

    Loads plain GPT-2 checkpoints too: `TiedGPT2LMHeadModel.from_pretrained(path, tying_map=[...])`
    keeps each tied block's source weights, compressing a pretrained model.
    """

    config_class = TiedGPT2Config
    tied_blocks_path = "transformer.h"

    def __init__(self, config: TiedGPT2Config, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        # transformers derives `loss_type` from the class name, and "GPT2LMHeadModel" names no loss: the model then
        # falls back to the causal loss, but the Trainer, which reads `loss_type`, counts the tokens it divides the
        # summed loss by over all labels instead of the shifted ones, one token per row too many. Every loss it
        # reported was low by (L - 1) / L for rows of L tokens. Declared, the count is the model's.
        self.loss_type = "ForCausalLM"


__all__ = ["TiedGPT2LMHeadModel"]
