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


__all__ = ["TiedGPT2LMHeadModel"]
