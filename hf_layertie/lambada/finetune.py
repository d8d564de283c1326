"""Fine-tuning on LAMBADA text with a fixed hold-out, since only the test release exists offline."""

import logging
from collections.abc import Sequence

import datasets
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# Words in a run that a held-out passage may not share with a training passage. LAMBADA's passages come from novels
# and carry no novel id: passages of one novel overlap, some ending on words a training passage holds.
SHARED_RUN_WORDS = 8


def lambada_finetune_split(passages: Sequence[str], eval_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """Split passages into (train, eval) with a fixed, documented hold-out: the LAST passages.

    `round(len(passages) * eval_fraction)` passages (at least one) at the end of the list are held
    out, in file order; no randomness, so every run and every user holds out the same passages.
    Those that share a run of `SHARED_RUN_WORDS` words with a training passage are not scored (a
    warning counts them): fine-tuning would have read their text, target word included.
    For the full 5,153-passage test file and the default 0.1: 4,638 train, of the last 515 passages
    502 are scored.
    """
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must be strictly between 0 and 1, got {eval_fraction}")
    num_eval = max(1, round(len(passages) * eval_fraction))
    if num_eval >= len(passages):
        raise ValueError(
            f"eval_fraction={eval_fraction} of {len(passages)} passages leaves no passage to train on"
        )
    train, tail = list(passages[:-num_eval]), list(passages[-num_eval:])
    trained_runs = set().union(*map(_word_runs, train))
    held_out = [passage for passage in tail if trained_runs.isdisjoint(_word_runs(passage))]
    if not held_out:
        raise ValueError(f"every one of the last {num_eval} passages shares text with a training passage: nothing to score")
    if len(held_out) < len(tail):
        logger.warning(
            f"{len(tail) - len(held_out)} of the {len(tail)} held-out LAMBADA passages share a run of "
            f"{SHARED_RUN_WORDS} words with a training passage and are not scored: {len(held_out)} are"
        )
    return train, held_out


def _word_runs(passage: str) -> set[tuple[str, ...]]:
    words = passage.split()
    return {tuple(words[start : start + SHARED_RUN_WORDS]) for start in range(len(words) - SHARED_RUN_WORDS + 1)}


def lambada_causal_lm_dataset(
    passages: Sequence[str], tokenizer: PreTrainedTokenizerBase, block_size: int
) -> datasets.Dataset:
    """One causal-LM example per passage (`input_ids`, `attention_mask`), unpadded, for the Trainer.

    Passages longer than `block_size` tokens lose their BEGINNING, so the target word, the part
    LAMBADA scores, is always kept. Tokenised without special tokens, like the evaluation. Batch with
    `DataCollatorForLanguageModeling(tokenizer, mlm=False)`, which pads and builds the labels (the
    GPT-2 tokenizer needs a `pad_token` for that).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")

    def tokenize(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        encoded = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
        input_ids = [ids[-block_size:] for ids in encoded]
        return {"input_ids": input_ids, "attention_mask": [[1] * len(ids) for ids in input_ids]}

    return datasets.Dataset.from_dict({"text": list(passages)}).map(
        tokenize, batched=True, remove_columns=["text"], desc="Tokenising LAMBADA passages"
    )
