"""hf-layertie: Dynamic Layer Tying (Hay & Wolf, ICLR 2024) for Hugging Face transformers.

Importing the package registers the tied model types with the Auto classes and marks them for
`register_for_auto_class`, so that saved checkpoints also load with `trust_remote_code=True`.
"""

from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

from .models import (
    STRATEGY_NAMES,
    ParameterCounts,
    RetieReport,
    TiedBertConfig,
    TiedBertForMaskedLM,
    TiedBlocksMixin,
    TiedGPT2Config,
    TiedGPT2LMHeadModel,
    TyingMap,
    parse_strategy,
)
from .model_card import build_model_card, write_model_card
from .trainer import TyingTrainer, TyingTrainingArguments

__version__ = "0.1.0"

for _config_class, _model_class, _auto_class in (
    (TiedGPT2Config, TiedGPT2LMHeadModel, AutoModelForCausalLM),
    (TiedBertConfig, TiedBertForMaskedLM, AutoModelForMaskedLM),
):
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    _auto_class.register(_config_class, _model_class, exist_ok=True)
    _config_class.register_for_auto_class()
    _model_class.register_for_auto_class(_auto_class.__name__)

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
    "TyingTrainer",
    "TyingTrainingArguments",
    "build_model_card",
    "parse_strategy",
    "write_model_card",
]
