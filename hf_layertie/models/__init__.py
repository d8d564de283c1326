"""Tied model classes. Kept in one flat folder with relative imports only: transformers copies these
files next to a saved checkpoint, which then loads with `trust_remote_code=True` without this package."""

from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from .configuration_tied_bert import TiedBertConfig  # noqa: F401 (exported by TIED_CLASS_NAMES)
from .configuration_tied_gpt2 import TiedGPT2Config  # noqa: F401 (exported by TIED_CLASS_NAMES)
from .configuration_tied_llama import TiedLlamaConfig  # noqa: F401 (exported by TIED_CLASS_NAMES)
from .configuration_tied_mistral import TiedMistralConfig  # noqa: F401 (exported by TIED_CLASS_NAMES)
from .configuration_tied_qwen2 import TiedQwen2Config  # noqa: F401 (exported by TIED_CLASS_NAMES)
from .configuration_tying import TyingConfigMixin
from .modeling_tied_bert import TiedBertForMaskedLM
from .modeling_tied_gpt2 import TiedGPT2LMHeadModel
from .modeling_tied_llama import TiedLlamaForCausalLM
from .modeling_tied_mistral import TiedMistralForCausalLM
from .modeling_tied_qwen2 import TiedQwen2ForCausalLM
from .tied_blocks import ParameterCounts, TiedBlocksMixin
from .tying_map import RetieReport, TyingMap
from .tying_strategies import STRATEGY_NAMES, check_static_spec, check_strategy_spec, parse_strategy, resolve_tying_map

# Every tied model class by `model_type` ("tied_llama", ...), with the Auto class it registers for.
TIED_MODELS = {
    model_class.config_class.model_type: (model_class, auto_class)
    for model_class, auto_class in (
        (TiedGPT2LMHeadModel, AutoModelForCausalLM),
        (TiedBertForMaskedLM, AutoModelForMaskedLM),
        (TiedLlamaForCausalLM, AutoModelForCausalLM),
        (TiedQwen2ForCausalLM, AutoModelForCausalLM),
        (TiedMistralForCausalLM, AutoModelForCausalLM),
    )
}

# Every tied class and its config by name, derived from TIED_MODELS: a class added there is exported here and
# from `hf_layertie` without a second edit.
TIED_CLASS_NAMES = [
    cls.__name__ for model_class, _ in TIED_MODELS.values() for cls in (model_class.config_class, model_class)
]

__all__ = [
    *TIED_CLASS_NAMES,
    "STRATEGY_NAMES",
    "TIED_MODELS",
    "ParameterCounts",
    "RetieReport",
    "TiedBlocksMixin",
    "TyingConfigMixin",
    "TyingMap",
    "check_static_spec",
    "check_strategy_spec",
    "parse_strategy",
    "resolve_tying_map",
]
