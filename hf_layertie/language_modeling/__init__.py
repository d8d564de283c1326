"""The workflow shared by `run_clm.py` (TiedGPT2, causal LM) and `run_mlm.py` (TiedBert, masked LM)."""

from .arguments import DataTrainingArguments, ModelArguments
from .run import CAUSAL_LM, MASKED_LM, LanguageModelingTask, parse_arguments, run

__all__ = ["CAUSAL_LM", "MASKED_LM", "DataTrainingArguments", "LanguageModelingTask", "ModelArguments", "parse_arguments", "run"]
