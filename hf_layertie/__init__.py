"""hf-layertie: Dynamic Layer Tying (Hay & Wolf, ICLR 2024) for Hugging Face transformers.

Importing the package registers the tied model types with the Auto classes and marks them for
`register_for_auto_class`, so that saved checkpoints also load with `trust_remote_code=True`. It changes
nothing else in the process (no logging, plotting or global settings).
"""

from transformers import AutoConfig

from . import models
from .model_card import build_model_card, write_model_card
from .models import *  # noqa: F403 (every tied class, derived from TIED_MODELS, and the tying primitives)
from .models import TIED_MODELS
from .serving import save_for_serving
from .sharding import gather_tied_model, retie_sharded, shard_tied_model
from .trainer import TyingTrainer, TyingTrainingArguments

__version__ = "0.1.0"

for _model_type, (_model_class, _auto_class) in TIED_MODELS.items():
    AutoConfig.register(_model_type, _model_class.config_class, exist_ok=True)
    _auto_class.register(_model_class.config_class, _model_class, exist_ok=True)
    _model_class.config_class.register_for_auto_class()
    _model_class.register_for_auto_class(_auto_class.__name__)

__all__ = [
    *models.__all__,
    "TyingTrainer",
    "TyingTrainingArguments",
    "build_model_card",
    "gather_tied_model",
    "retie_sharded",
    "save_for_serving",
    "shard_tied_model",
    "write_model_card",
]
