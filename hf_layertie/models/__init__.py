"""Tied model classes. Kept in one flat folder with relative imports only: transformers copies these
files next to a saved checkpoint, which then loads with `trust_remote_code=True` without this package."""

from .configuration_tied_bert import TiedBertConfig
from .configuration_tied_gpt2 import TiedGPT2Config
from .modeling_tied_bert import TiedBertForMaskedLM
from .modeling_tied_gpt2 import TiedGPT2LMHeadModel
from .tied_blocks import ParameterCounts, RetieReport, TiedBlocksMixin
from .tying_map import TyingMap
from .tying_strategies import STRATEGY_NAMES, check_strategy_spec, parse_strategy, resolve_tying_map

__all__ = [
    "STRATEGY_NAMES",
    "ParameterCounts",
    "RetieReport",
    "TiedBertConfig",
    "TiedBertForMaskedLM",
    "TiedBlocksMixin",
    "TiedGPT2Config",
    "TiedGPT2LMHeadModel",
    "TyingMap",
    "check_strategy_spec",
    "parse_strategy",
    "resolve_tying_map",
]
