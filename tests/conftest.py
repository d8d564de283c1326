"""Test set-up for every test file: offline Hub, one torch thread, and the fixtures that test files in several folders
use. Tiny model configs, every tied model class and other shared helpers are in `helpers` (tests/helpers/), which
the suite puts on sys.path (`pythonpath` in pyproject.toml)."""

import os

# Set before transformers / huggingface_hub are imported: without it a Hub-style load waits minutes for
# network time-outs on machines without internet.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers.models import make_tiny_bert_config, make_tiny_gpt2_config  # noqa: E402
from helpers.scripts import TINY_GPT2, play_lines, tiny_flags  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from hf_layertie.language_modeling import CAUSAL_LM, run  # noqa: E402

# The test models are tiny: one intra-op thread is several times faster than two on a shared 2-core
# machine, where spinning worker threads compete with the other processes.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_gpt2_config():
    """Factory `tiny_gpt2_config(tying_map, **overrides)` (session-scoped so hypothesis tests may use it)."""
    return make_tiny_gpt2_config


@pytest.fixture(scope="session")
def tiny_bert_config():
    """Factory `tiny_bert_config(tying_map, **overrides)` (session-scoped so hypothesis tests may use it)."""
    return make_tiny_bert_config


# ----- a tiny run_clm.py run and what is made of it (scripts, conversion, relaxed ties, distillation) -----


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text")
    (folder / "train.txt").write_text(play_lines(400))
    (folder / "validation.txt").write_text(play_lines(100, start=2000))
    return folder


@pytest.fixture(scope="module")
def clm_run(tmp_path_factory, text_files):
    output_dir = tmp_path_factory.mktemp("clm")
    metrics = run(CAUSAL_LM, tiny_flags(output_dir, text_files, TINY_GPT2))
    return output_dir, metrics


@pytest.fixture(scope="module")
def trained_plain_checkpoint(tmp_path_factory, clm_run):
    """A trained plain GPT-2 of 3 blocks with its tokenizer: the tied test run's model exported by `to_untied()`."""

    folder = tmp_path_factory.mktemp("plain")
    AutoModelForCausalLM.from_pretrained(clm_run[0]).to_untied().save_pretrained(folder)
    AutoTokenizer.from_pretrained(clm_run[0]).save_pretrained(folder)
    return folder
