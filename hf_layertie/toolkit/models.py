"""Loading tokenizers and tied models for the scripts, with errors that name the argument."""

from __future__ import annotations

import logging
import os
from typing import get_args

import torch
from huggingface_hub.utils import HFValidationError, validate_repo_id
from safetensors import SafetensorError
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import is_flash_attn_2_available

from ..checks import reworded
from ..data import TokenizerKind, embedded_tokenizer_dir
from ..models import TIED_MODELS
from ..models.configuration_tying import check_skipped_positions
from ..trainer.checkpoint_format import WEIGHTS_FILES

logger = logging.getLogger(__name__)

# Names that load the tokenizer shipped in hf_layertie/data (the files are the Hub's, or trained here): each kind
# by its own name, and the two Hub ones also by their current repo ids.
SHIPPED_TOKENIZERS = {
    **{kind: kind for kind in get_args(TokenizerKind)},
    "openai-community/gpt2": "gpt2",
    "google-bert/bert-base-uncased": "bert-base-uncased",
}

def tied_model_types(auto_class: type) -> tuple[str, ...]:
    """The tied model types registered for `auto_class` (`AutoModelForCausalLM`, ...), in `TIED_MODELS` order."""
    return tuple(name for name, (_, auto) in TIED_MODELS.items() if auto is auto_class)


# A model built from scratch larger than this is almost surely a config left at its defaults (Llama's: 7B).
LARGEST_FROM_SCRATCH = 1_000_000_000

# `--torch_dtype` values, as in transformers' run_clm.py ("auto": a checkpoint's own dtype).
TORCH_DTYPES = ("auto", "bfloat16", "float16", "float32")
# `--attn_implementation` values: the ones every tied class supports (`_supports_sdpa`, `_supports_flash_attn`).
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")


def load_tokenizer(
    name_or_path: str,
    masked: bool = False,
    cache_dir: str | None = None,
    revision: str = "main",
    trust_remote_code: bool = False,
    flag: str = "--tokenizer_name",
) -> PreTrainedTokenizerBase:
    """A tokenizer by folder, Hub id or shipped name (`SHIPPED_TOKENIZERS`, loaded offline from the package).

    `masked=True` checks for the mask and padding tokens that masked language modeling needs; a tokenizer without
    them is refused naming `flag`, the argument `name_or_path` came from.
    """
    source = embedded_tokenizer_dir(SHIPPED_TOKENIZERS[name_or_path]) if name_or_path in SHIPPED_TOKENIZERS else name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, cache_dir=cache_dir, revision=revision, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as error:
        raise reworded(error, f"{flag} {name_or_path}: could not load a tokenizer: {error}") from error
    if not set(tokenizer.get_vocab()) - set(tokenizer.all_special_tokens):
        # A folder without tokenizer files loads (transformers 5) as a tokenizer of special tokens alone.
        raise ValueError(
            f"{flag} {name_or_path}: no tokenizer there (it loads with special tokens only, {len(tokenizer)}); pass a "
            f"folder with tokenizer files (tokenizer.json, or vocab and merges), a Hub id, or one of "
            f"{', '.join(SHIPPED_TOKENIZERS)}"
        )
    if masked and (tokenizer.mask_token is None or tokenizer.pad_token is None):
        raise ValueError(
            f"{flag} {name_or_path}: masked language modeling needs a tokenizer with a mask token and a pad token, "
            f"this one has mask_token={tokenizer.mask_token!r} and pad_token={tokenizer.pad_token!r} (a causal "
            f"model's tokenizer has neither: pass a masked model, or --tokenizer_name a tokenizer that has both)"
        )
    return tokenizer


def check_model_source(flag: str, name_or_path: str) -> None:
    """Refuse a name that is neither a folder nor shaped like a Hub repo id (`name` or `namespace/name`): a folder
    that is missing or mistyped, which transformers would report as a malformed repo id."""
    if os.path.isdir(name_or_path):
        return
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        problem = "is not a folder" if os.path.exists(name_or_path) else "no such folder"
        raise ValueError(
            f"{flag} {name_or_path}: {problem}, and not a Hub repo id ('name' or 'namespace/name'); pass the folder "
            f"of a saved model (the one holding its config.json) or a Hub repo id"
        ) from None


def tied_model_type(name_or_path: str, model_type: str | None = None, **hub_options) -> str:
    """The tied model type to load `name_or_path` into: the checkpoint's own type, tied (`gpt2` -> `tied_gpt2`).

    A `model_type` given must be that type: another would build its own default config (a 6.7B-parameter Llama
    for a GPT-2 checkpoint) from fields it does not read.
    """
    if model_type is not None:
        check_tied_model_type(model_type)
    saved = AutoConfig.from_pretrained(name_or_path, **hub_options).model_type
    own = next((candidate for candidate in (saved, f"tied_{saved}") if candidate in TIED_MODELS), None)
    if own is None:
        raise ValueError(
            f"--model_name_or_path {name_or_path} is a {saved!r} checkpoint, which hf-layertie has no tied class for; "
            f"tied types: {', '.join(TIED_MODELS)}"
        )
    if model_type not in (None, own):
        raise ValueError(
            f"--model_type {model_type} does not match --model_name_or_path {name_or_path}, a {saved!r} checkpoint: "
            f"leave --model_type unset (it defaults to the checkpoint's own type, {own}) or pass --model_type {own}"
        )
    return own


def check_tied_model_type(model_type: str) -> None:
    if model_type not in TIED_MODELS:
        raise ValueError(f"--model_type {model_type!r} is not a tied model type; expected one of {', '.join(TIED_MODELS)}")


def check_loading_options(torch_dtype: str | None, attn_implementation: str | None) -> None:
    """Refuse a dtype or attention implementation by its flag before any data or model is loaded: transformers
    says so only once the model is built, and without naming the flag (flash-attn missing: an ImportError)."""
    if torch_dtype not in (None, *TORCH_DTYPES):
        raise ValueError(f"--torch_dtype {torch_dtype!r}: expected one of {', '.join(TORCH_DTYPES)}")
    if attn_implementation not in (None, *ATTN_IMPLEMENTATIONS):
        raise ValueError(f"--attn_implementation {attn_implementation!r}: expected one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    if attn_implementation == "flash_attention_2" and not is_flash_attn_2_available():
        raise ValueError(
            "--attn_implementation flash_attention_2 needs the flash-attn package and a GPU it supports, which this "
            "machine lacks; pass --attn_implementation sdpa or eager"
        )


def load_model(
    model_type: str,
    tokenizer: PreTrainedTokenizerBase,
    name_or_path: str | None = None,
    config_overrides: str | None = None,
    torch_dtype: str | None = None,
    attn_implementation: str | None = None,
    looped_config: dict | None = None,
    **hub_options,
) -> PreTrainedModel:
    """A checkpoint (tied, or plain and then loaded untied into the tied class), or a new model of `model_type`
    from scratch, sized to the tokenizer and changed by `config_overrides` (`"n_layer=6,n_embd=128"`).

    `looped_config` (`ModelArguments.looped_config`) sets tied config fields: `skipped_positions` on any model (this
    run's depth; `[]`: every position), the loop recipe's (`LOOP_RECIPE_FIELDS`) from scratch.

    `torch_dtype` (`TORCH_DTYPES`) and `attn_implementation` (`ATTN_IMPLEMENTATIONS`) go to `from_pretrained`, or
    to the type's auto class's `from_config` from scratch; None keeps transformers' default.
    """
    check_tied_model_type(model_type)
    check_loading_options(torch_dtype, attn_implementation)
    model_class, auto_class = TIED_MODELS[model_type]
    options = _loading_options(torch_dtype, attn_implementation, from_scratch=name_or_path is None)
    looped_config = dict(looped_config or {})
    if name_or_path is not None:
        model = _from_checkpoint(model_class, name_or_path, **options, **hub_options)
        if "skipped_positions" in looped_config:
            model.config.skipped_positions = _checked_positions(looped_config["skipped_positions"], len(model.tied_blocks))
        _fit_embedding_to_tokenizer(model, tokenizer, name_or_path)
        if model.adapted_blocks_sharing_weights():  # relaxed ties, which train adapters and shared weights alike:
            model.requires_grad_(True)  # transformers loads adapters frozen, for inference
        return model
    config = from_scratch_config(model_class.config_class, tokenizer, config_overrides)
    if "skipped_positions" in looped_config:
        looped_config["skipped_positions"] = _checked_positions(looped_config["skipped_positions"], config.num_hidden_layers)
    for name, value in looped_config.items():
        setattr(config, name, value)
    size = _approximate_parameters(config)
    if size > LARGEST_FROM_SCRATCH:
        raise ValueError(
            f"A {model_type} built from scratch with {config_overrides or 'the default config'} has about "
            f"{size / 1e9:.1f}B parameters; pass --config_overrides to size it (e.g. "
            f"'{small_size_overrides(model_class.config_class)}')"
        )
    return auto_class.from_config(config, **options)


def _checked_positions(positions: list[int], num_blocks: int) -> list[int] | None:
    return check_skipped_positions(positions, num_blocks, name="--skipped_positions")


def from_scratch_config(config_class: type[PretrainedConfig], tokenizer, config_overrides: str | None = None) -> PretrainedConfig:
    """A new config of `config_class` sized to the tokenizer, with `config_overrides` (`"n_layer=6,n_embd=128"`)
    passed to its constructor, so that the fields derived from them follow: Llama's and Mistral's `head_dim`,
    Qwen2's `layer_types`. Set on a built config (`update_from_string`), they would keep the defaults' values: a
    head_dim of 128 at any width, 32 layer types at any depth. transformers parses each value by its field's type.
    Overrides that set the attention heads but not `num_key_value_heads` get as many key-value heads (multi-head
    attention), as Llama's own default does; a 32-head default (Qwen2's) would not divide 4 heads."""
    special_ids = {
        key: getattr(tokenizer, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id") if getattr(tokenizer, key) is not None
    }
    if config_overrides is None:
        return config_class(vocab_size=len(tokenizer), **special_ids)
    parsed = config_class()
    try:
        parsed.update_from_string(config_overrides)
    except (ValueError, TypeError) as error:  # transformers raises TypeError for a field of another type
        raise ValueError(
            f"--config_overrides {config_overrides!r}: {error}; expected comma-separated key=value pairs of "
            f"{config_class.__name__} fields, e.g. '{small_size_overrides(config_class)}'"
        ) from None
    names = [config_class.attribute_map.get(name, name) for name in _override_names(config_overrides)]
    fields = {name: getattr(parsed, name) for name in names}
    if "num_attention_heads" in fields and "num_key_value_heads" not in fields and hasattr(parsed, "num_key_value_heads"):
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    logger.info(f"Config built with {config_overrides}")
    return config_class(**{"vocab_size": len(tokenizer), **special_ids, **fields})


def _override_names(config_overrides: str) -> list[str]:
    """The field names of `"key=value,key=value"`, split as `PretrainedConfig.update_from_string` splits them."""
    return [item.split("=")[0] for item in config_overrides.split(",")]


# The size a from-scratch model is suggested, in any config's own field names (`small_size_overrides`): the embedded
# default's (clm_default.json), which `run_clm.py --model_type <type>` gives a model of another type.
SMALL_SIZE = {"num_hidden_layers": 6, "hidden_size": 96, "num_attention_heads": 4, "intermediate_size": 384}


def small_size_overrides(config_class: type[PretrainedConfig]) -> str:
    """`SMALL_SIZE` as `--config_overrides` for `config_class`, under its own names (GPT-2's `n_layer`, ...; GPT-2
    has no `intermediate_size`: its MLP is 4 x hidden_size, the same 384)."""
    fields = {config_class.attribute_map.get(name, name): value for name, value in SMALL_SIZE.items()}
    known = config_class.__dataclass_fields__
    return ",".join(f"{name}={value}" for name, value in fields.items() if name in known)


def _fit_embedding_to_tokenizer(model: PreTrainedModel, tokenizer, name_or_path: str) -> None:
    """Give every token of a tokenizer larger than the checkpoint's vocabulary an embedding row, as transformers'
    run_clm.py does (else the first id past the table fails inside the forward pass)."""
    embedding_size = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) <= embedding_size:
        return
    logger.warning(f"The tokenizer has {len(tokenizer)} tokens, {name_or_path}'s embedding {embedding_size}: resizing it (the new rows are untrained)")
    model.resize_token_embeddings(len(tokenizer))


def _loading_options(torch_dtype: str | None, attn_implementation: str | None, from_scratch: bool) -> dict:
    """The keyword arguments of `from_pretrained` / `from_config` for the two flags. From scratch there are no
    weights for "auto" to take a dtype from: the config's applies (float32), as in transformers' run_clm.py."""
    options = {}
    if torch_dtype is not None and not (from_scratch and torch_dtype == "auto"):
        options["dtype"] = torch_dtype if torch_dtype == "auto" else getattr(torch, torch_dtype)
    if attn_implementation is not None:
        options["attn_implementation"] = attn_implementation
    return options


def _approximate_parameters(config) -> int:
    """Blocks (about 12 h^2 each, attention and a 4h MLP) plus the token embedding."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    return layers * 12 * hidden * hidden + config.vocab_size * hidden


def _from_checkpoint(model_class, name_or_path: str, **hub_options) -> PreTrainedModel:
    try:
        return model_class.from_pretrained(name_or_path, **hub_options)
    except (OSError, ValueError, RuntimeError, SafetensorError) as error:
        raise reworded(error, f"--model_name_or_path {name_or_path}: could not load {_weights_file(name_or_path)}: {error}") from error


def _weights_file(name_or_path: str) -> str:
    """The weights file of a local checkpoint, for error messages (the folder itself when none is found)."""
    for name in WEIGHTS_FILES:
        if os.path.isfile(os.path.join(name_or_path, name)):
            return os.path.join(name_or_path, name)
    return name_or_path
