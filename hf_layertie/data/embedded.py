"""Tokenizers, a small Shakespeare corpus and the LAMBADA test set, shipped inside the package.

They make the default training run work on a fresh clone without network access: nothing here
touches the Hugging Face Hub. Provenance, licences and checksums are in this folder's README.md.
"""

from pathlib import Path
from typing import Literal

import datasets
from transformers import BertTokenizerFast, GPT2TokenizerFast, PreTrainedTokenizerFast

DATA_DIR = Path(__file__).resolve().parent
TOKENIZERS_DIR = DATA_DIR / "tokenizers"
SHAKESPEARE_DIR = DATA_DIR / "shakespeare"
# OpenAI's detokenized LAMBADA test set (lm-eval-harness `lambada_openai`), CC BY 4.0: see lambada/LICENSE.
LAMBADA_TEST_FILE = DATA_DIR / "lambada" / "lambada_test.jsonl"

TokenizerKind = Literal["gpt2", "bert-base-uncased", "shakespeare-bpe", "shakespeare-wordpiece"]
_TOKENIZER_CLASSES: dict[str, type[PreTrainedTokenizerFast]] = {
    "gpt2": GPT2TokenizerFast,
    "bert-base-uncased": BertTokenizerFast,
    "shakespeare-bpe": GPT2TokenizerFast,
    "shakespeare-wordpiece": BertTokenizerFast,
}

# Whole plays per split, so no scene or speech of an evaluation play is ever seen in training.
# About 80/10/10 by characters: 778,731 / 103,427 / 98,439.
SHAKESPEARE_SPLITS: dict[str, tuple[str, ...]] = {
    "train": (
        "comedy_of_errors",
        "julius_caesar",
        "merchant_of_venice",
        "midsummer_nights_dream",
        "romeo_and_juliet",
        "twelfth_night",
        "two_gentlemen_of_verona",
    ),
    "validation": ("macbeth",),
    "test": ("tempest",),
}


def embedded_tokenizer_dir(kind: TokenizerKind) -> Path:
    """Folder holding the shipped tokenizer files, usable as `from_pretrained(folder)`."""
    if kind not in _TOKENIZER_CLASSES:
        raise ValueError(f"kind must be one of {sorted(_TOKENIZER_CLASSES)}, got {kind!r}")
    return TOKENIZERS_DIR / kind


def load_embedded_tokenizer(kind: TokenizerKind) -> PreTrainedTokenizerFast:
    """Load a shipped tokenizer exactly as `from_pretrained` builds it.

    The GPT-2 tokenizer has no padding token (as on the Hub); callers that pad batches usually
    set `tokenizer.pad_token = tokenizer.eos_token` themselves.
    """
    folder = embedded_tokenizer_dir(kind)
    return _TOKENIZER_CLASSES[kind].from_pretrained(folder)


def embedded_corpus_files() -> dict[str, list[Path]]:
    """The shipped plays as {"train", "validation", "test"} -> text files, split by whole play."""
    return {
        split: [SHAKESPEARE_DIR / f"{play}_gut.txt" for play in plays]
        for split, plays in SHAKESPEARE_SPLITS.items()
    }


def load_embedded_corpus(streaming: bool = False) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    """Load the shipped corpus with the `datasets` "text" builder, as `run_clm.py` reads a `.txt` file: one
    example per line, line breaks kept (so a model learns where verse lines and speeches end, and its samples
    look like a play). `streaming`: as streams (`IterableDataset`s), as `run_clm.py --streaming` reads its data."""
    data_files = {split: [str(path) for path in paths] for split, paths in embedded_corpus_files().items()}
    return datasets.load_dataset("text", data_files=data_files, keep_linebreaks=True, streaming=streaming)
