"""The toolkit every script shares (`run_clm.py`, `run_mlm.py`, `run_lambada.py`, `bench/`): arguments, data,
tokenizers and models, logging, ending the process group, the reward batch and count baselines. Every
function takes plain values."""

from .arguments import (
    ModelArguments,
    changed_from_default,
    check_training_sources,
    parse_command_line,
    refuse_training_settings_without_training,
)
from .baselines import bigram_loss, unigram_loss
from .data import (
    fit_tokenizer_to_model,
    has_own_validation_split,
    load_text_datasets,
    mask_evaluation_blocks,
    read_stream,
    resolve_block_size,
    split_reward_examples,
    take_first,
    text_column,
    tokenize_and_group,
)
from .logs import set_up_logging
from .models import (
    SHIPPED_TOKENIZERS,
    check_tied_model_type,
    load_model,
    load_tokenizer,
    tied_model_type,
    tied_model_types,
)
from .processes import process_group_ended, this_process_share

__all__ = [
    "SHIPPED_TOKENIZERS",
    "ModelArguments",
    "bigram_loss",
    "check_tied_model_type",
    "changed_from_default",
    "fit_tokenizer_to_model",
    "has_own_validation_split",
    "load_model",
    "load_text_datasets",
    "load_tokenizer",
    "mask_evaluation_blocks",
    "check_training_sources",
    "refuse_training_settings_without_training",
    "parse_command_line",
    "process_group_ended",
    "read_stream",
    "resolve_block_size",
    "set_up_logging",
    "split_reward_examples",
    "take_first",
    "text_column",
    "this_process_share",
    "tied_model_type",
    "tied_model_types",
    "tokenize_and_group",
    "unigram_loss",
]
