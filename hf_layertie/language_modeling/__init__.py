"""The workflow shared by `run_clm.py` (tied causal LMs) and `run_mlm.py` (tied BERT)."""

from .arguments import DataTrainingArguments
from .generated_tasks import HOP_TASKS, evaluate_hop_task, hop_task_tokenizer, load_hop_task
from .run import CAUSAL_LM, MASKED_LM, LanguageModelingTask, parse_arguments, run

__all__ = [
    "CAUSAL_LM",
    "HOP_TASKS",
    "MASKED_LM",
    "DataTrainingArguments",
    "LanguageModelingTask",
    "evaluate_hop_task",
    "hop_task_tokenizer",
    "load_hop_task",
    "parse_arguments",
    "run",
]
