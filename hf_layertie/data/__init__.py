"""Data shipped with hf-layertie: tokenizers, a Shakespeare corpus and LAMBADA, for offline default runs."""

from .embedded import (
    LAMBADA_TEST_FILE,
    SHAKESPEARE_DIR,
    SHAKESPEARE_SPLITS,
    TokenizerKind,
    embedded_corpus_files,
    embedded_tokenizer_dir,
    load_embedded_corpus,
    load_embedded_tokenizer,
)
from .word_problem import WordProblemConfig, is_solvable

__all__ = [
    "LAMBADA_TEST_FILE",
    "SHAKESPEARE_DIR",
    "SHAKESPEARE_SPLITS",
    "TokenizerKind",
    "WordProblemConfig",
    "embedded_corpus_files",
    "embedded_tokenizer_dir",
    "load_embedded_corpus",
    "is_solvable",
    "load_embedded_tokenizer",
]
