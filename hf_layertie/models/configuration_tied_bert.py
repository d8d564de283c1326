"""Configuration of a BERT whose encoder layers can share weights."""

from transformers import BertConfig

from .tying_map import TyingConfigMixin


class TiedBertConfig(TyingConfigMixin, BertConfig):
    r"""
    [`BertConfig`] with a tying map. Every BERT field keeps its meaning; one field is added:

    tying_map (`list[int]`, *optional*):
        `tying_map[i] = j` makes encoder layer `i` use layer `j`'s weights (`j <= i`; `j == i`:
        independent; layer 0 is always independent). Stored in canonical form. `None` means every
        layer is independent. Invalid maps raise `ValueError` naming the index, the value and the
        rule broken.
    """

    model_type = "tied_bert"

    tying_map: list | None = None


__all__ = ["TiedBertConfig"]
