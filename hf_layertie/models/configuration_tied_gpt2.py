"""Configuration of a GPT-2 whose transformer blocks can share weights."""

from transformers import GPT2Config

from .configuration_tying import TyingConfigMixin


class TiedGPT2Config(TyingConfigMixin, GPT2Config):
    r"""
    [`GPT2Config`] with a tying map over the blocks `transformer.h`. Every GPT-2 field keeps its meaning; two
    are added, `tying_map` and `tie_init` (documented in [`TyingConfigMixin`]).

    Example:

    ```python
    >>> from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel
    >>> config = TiedGPT2Config(n_layer=4, n_embd=64, n_head=4, tying_map=[0, 0, 2, 2])
    >>> model = TiedGPT2LMHeadModel(config)
    >>> model.tying_map.num_distinct
    2
    ```
    """

    model_type = "tied_gpt2"


__all__ = ["TiedGPT2Config"]
