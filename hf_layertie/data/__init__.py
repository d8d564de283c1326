"""Data shipped with hf-layertie: tokenizers and a Shakespeare corpus for offline default runs."""

from .embedded import (
    SHAKESPEARE_SPLITS,
    TokenizerKind,
    embedded_corpus_files,
    embedded_tokenizer_dir,
    load_embedded_corpus,
    load_embedded_tokenizer,
)

__all__ = [
    "SHAKESPEARE_SPLITS",
    "TokenizerKind",
    "embedded_corpus_files",
    "embedded_tokenizer_dir",
    "load_embedded_corpus",
    "load_embedded_tokenizer",
]
