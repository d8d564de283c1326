"""One logging set-up for every script: hf-layertie, datasets and transformers at the process's level."""

from __future__ import annotations

import logging
import sys

import datasets
import transformers


def set_up_logging(level: int) -> None:
    """Log to stdout with timestamps; `level` is `TrainingArguments.get_process_log_level()` (quieter on replicas)."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    logging.getLogger("hf_layertie").setLevel(level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
