"""The workflow shared by `run_clm.py` (tied causal LMs) and `run_mlm.py` (tied BERT)."""

from .arguments import DataTrainingArguments
from .run import CAUSAL_LM, MASKED_LM, LanguageModelingTask, parse_arguments, run

__all__ = [
    "CAUSAL_LM",
    "MASKED_LM",
    "DataTrainingArguments",
    "LanguageModelingTask",
    "parse_arguments",
    "run",
]
