"""LAMBADA (Paperno et al., 2016) in lm-eval-harness `lambada_openai`'s protocol: reading, evaluation, fine-tuning data."""

from .evaluation import evaluate_lambada
from .finetune import lambada_causal_lm_dataset, lambada_finetune_split
from .reader import read_lambada_jsonl, split_context_target

__all__ = [
    "evaluate_lambada",
    "lambada_causal_lm_dataset",
    "lambada_finetune_split",
    "read_lambada_jsonl",
    "split_context_target",
]
