"""hf-layertie: Dynamic Layer Tying (Hay & Wolf, ICLR 2024) for Hugging Face transformers.

Importing the package registers the tied model types with the Auto classes and marks them for
`register_for_auto_class`, so that saved checkpoints also load with `trust_remote_code=True`.
"""

from transformers import AutoConfig

from .models import (
    STRATEGY_NAMES,
    TIED_MODELS,
    ParameterCounts,
    RetieReport,
    TiedBertConfig,
    TiedBertForMaskedLM,
    TiedBlocksMixin,
    TiedGPT2Config,
    TiedGPT2LMHeadModel,
    TiedLlamaConfig,
    TiedLlamaForCausalLM,
    TiedMistralConfig,
    TiedMistralForCausalLM,
    TiedQwen2Config,
    TiedQwen2ForCausalLM,
    TyingMap,
    parse_strategy,
)
from .model_card import build_model_card, write_model_card
from .trainer import TyingTrainer, TyingTrainingArguments

__version__ = "0.1.0"

for _model_type, (_model_class, _auto_class) in TIED_MODELS.items():
    AutoConfig.register(_model_type, _model_class.config_class, exist_ok=True)
    _auto_class.register(_model_class.config_class, _model_class, exist_ok=True)
    _model_class.config_class.register_for_auto_class()
    _model_class.register_for_auto_class(_auto_class.__name__)

__all__ = [
    "STRATEGY_NAMES",
    "TIED_MODELS",
    "ParameterCounts",
    "RetieReport",
    "TiedBertConfig",
    "TiedBertForMaskedLM",
    "TiedBlocksMixin",
    "TiedGPT2Config",
    "TiedGPT2LMHeadModel",
    "TiedLlamaConfig",
    "TiedLlamaForCausalLM",
    "TiedMistralConfig",
    "TiedMistralForCausalLM",
    "TiedQwen2Config",
    "TiedQwen2ForCausalLM",
    "TyingMap",
    "TyingTrainer",
    "TyingTrainingArguments",
    "build_model_card",
    "parse_strategy",
    "write_model_card",
]
