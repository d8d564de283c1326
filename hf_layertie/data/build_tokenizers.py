"""Rebuild the two tokenizers trained on the shipped training plays (the default runs' tokenizers).

    python -m hf_layertie.data.build_tokenizers

Trained the way the Hugging Face course trains a tokenizer for a new corpus: an existing fast tokenizer's
`train_new_from_iterator` keeps its algorithm, normalisation and special tokens and learns a new vocabulary.

- `tokenizers/shakespeare-bpe/`: GPT-2's byte-level BPE (`run_clm.py`'s default), 2,048 tokens.
- `tokenizers/shakespeare-wordpiece/`: bert-base-uncased's WordPiece (`run_mlm.py`'s default), 2,048 tokens.

Why 2,048: with GPT-2's 50,257 tokens, a small model is mostly embedding (89% of the default model's
parameters) and learns slowly; at 2,048 the transformer blocks, the part that tying shares, hold over 80%.
Only the training plays are read, line by line with their line breaks, so no evaluation text leaks into the
vocabulary. The BPE rebuild is byte-identical; WordPiece orders its initial alphabet differently from run to run,
so its rebuild has the same vocabulary with some ids permuted (`tests/data/test_embedded_data.py` checks both).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from .embedded import SHAKESPEARE_SPLITS, TOKENIZERS_DIR, embedded_corpus_files, load_embedded_tokenizer

VOCABULARY_SIZE = 2048
# Shipped name -> the tokenizer whose algorithm and special tokens it keeps.
TRAINED_FROM = {"shakespeare-bpe": "gpt2", "shakespeare-wordpiece": "bert-base-uncased"}


def training_lines() -> Iterator[str]:
    """Every line of the training plays (`SHAKESPEARE_SPLITS["train"]`), line breaks included."""
    for path in embedded_corpus_files()["train"]:
        with open(path, encoding="utf-8") as play:
            yield from play


def train_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """The tokenizer `name` (a key of `TRAINED_FROM`), trained anew on the training plays."""
    base = load_embedded_tokenizer(TRAINED_FROM[name])
    return base.train_new_from_iterator(training_lines(), vocab_size=VOCABULARY_SIZE)


def build(output_dir: Path = TOKENIZERS_DIR) -> list[Path]:
    """Train both tokenizers and save each in `output_dir/<name>/`; returns the folders."""
    folders = []
    for name in TRAINED_FROM:
        folder = Path(output_dir) / name
        train_tokenizer(name).save_pretrained(folder)
        folders.append(folder)
    return folders


if __name__ == "__main__":
    for folder in build():
        print(f"wrote {folder} (trained on {', '.join(SHAKESPEARE_SPLITS['train'])})")
