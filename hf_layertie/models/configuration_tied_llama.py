"""Configuration of a Llama whose decoder layers can share weights."""

from transformers import LlamaConfig

from .configuration_tying import TyingConfigMixin


class TiedLlamaConfig(TyingConfigMixin, LlamaConfig):
    r"""
    [`LlamaConfig`] with a tying map over the decoder layers `model.layers`. Every Llama field keeps its meaning;
    two are added, `tying_map` and `tie_init` (documented in [`TyingConfigMixin`]).

    Example (a pretrained Llama with its 16 layers looped as 4 distinct ones, each group starting from the
    average of its layers):

    ```python
    >>> from hf_layertie import TiedLlamaForCausalLM, parse_strategy
    >>> model = TiedLlamaForCausalLM.from_pretrained(
    ...     "path/to/llama", tying_map=parse_strategy("cycle:4", 16).to_list(), tie_init="mean"
    ... )
    ```
    """

    model_type = "tied_llama"


__all__ = ["TiedLlamaConfig"]
