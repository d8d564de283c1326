"""Configuration of a GPT-2 whose transformer blocks can share weights."""

from transformers import GPT2Config

from .tying_map import TyingConfigMixin


class TiedGPT2Config(TyingConfigMixin, GPT2Config):
    r"""
    [`GPT2Config`] with a tying map. Every GPT-2 field keeps its meaning; one field is added:

    tying_map (`list[int]`, *optional*):
        `tying_map[i] = j` makes block `i` use block `j`'s weights (`j <= i`; `j == i`: independent;
        block 0 is always independent). Stored in canonical form (chains resolved to the block that
        owns the weights). `None` means every block is independent. Invalid maps raise `ValueError`
        naming the index, the value and the rule broken.

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

    tying_map: list | None = None


__all__ = ["TiedGPT2Config"]
