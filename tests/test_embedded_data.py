"""The tokenizers and corpus shipped in the package: right ids, a leak-free split by play, real loading."""

import hashlib
import re

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_layertie.data import (
    SHAKESPEARE_SPLITS,
    embedded_corpus_files,
    embedded_tokenizer_dir,
    load_embedded_corpus,
    load_embedded_tokenizer,
)
from hf_layertie.data.embedded import DATA_DIR, SHAKESPEARE_DIR

# Known ids from the original tokenizers (see ../shared/data/README.md).
KNOWN_IDS = {"gpt2": [15496, 995], "bert-base-uncased": [101, 7592, 2088, 102]}
MAX_LENGTHS = {"gpt2": 1024, "bert-base-uncased": 512}


@pytest.mark.parametrize("kind", sorted(KNOWN_IDS))
def test_embedded_tokenizer_gives_the_original_ids(kind):
    tokenizer = load_embedded_tokenizer(kind)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert tokenizer("Hello world")["input_ids"] == KNOWN_IDS[kind]
    assert tokenizer.model_max_length == MAX_LENGTHS[kind]


@pytest.mark.parametrize("kind", sorted(KNOWN_IDS))
def test_embedded_tokenizer_dir_loads_with_auto_tokenizer(kind):
    tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir(kind))
    assert tokenizer("Hello world")["input_ids"] == KNOWN_IDS[kind]


def test_gpt2_tokenizer_is_left_without_pad_token_as_on_the_hub():
    tokenizer = load_embedded_tokenizer("gpt2")
    assert tokenizer.pad_token is None
    assert tokenizer.eos_token == "<|endoftext|>"
    assert len(tokenizer) == 50257


def test_unknown_tokenizer_kind_is_rejected_by_name():
    with pytest.raises(ValueError, match=r"one of \['bert-base-uncased', 'gpt2'\], got 'gpt3'"):
        load_embedded_tokenizer("gpt3")


def test_readme_checksums_match_the_shipped_files():
    readme = (DATA_DIR / "README.md").read_text()
    listed = dict(re.findall(r"`([\w./-]+)`[^\n]*`([0-9a-f]{64})`", readme))
    shipped = sorted(path for path in DATA_DIR.rglob("*.txt")) + sorted(DATA_DIR.rglob("*.json"))
    checksummed = [path for path in shipped if path.name != "tokenizer_config.json"]
    assert {str(path.relative_to(DATA_DIR)) for path in checksummed} == set(listed)
    for path in checksummed:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == listed[str(path.relative_to(DATA_DIR))], path


def test_every_shipped_play_is_in_exactly_one_split():
    files = embedded_corpus_files()
    assert list(files) == ["train", "validation", "test"]
    assigned = [path for paths in files.values() for path in paths]
    assert len(assigned) == len(set(assigned))
    assert set(assigned) == set(SHAKESPEARE_DIR.glob("*.txt"))
    assert all(paths for paths in files.values())


def test_splits_keep_whole_plays_apart():
    plays = {split: {path.stem for path in paths} for split, paths in embedded_corpus_files().items()}
    assert not plays["train"] & plays["validation"]
    assert not plays["train"] & plays["test"]
    assert not plays["validation"] & plays["test"]
    assert plays["validation"] == {"macbeth_gut"} and plays["test"] == {"tempest_gut"}
    assert {path.stem for paths in embedded_corpus_files().values() for path in paths} == {
        f"{play}_gut" for plays_in_split in SHAKESPEARE_SPLITS.values() for play in plays_in_split
    }


def test_no_line_of_an_evaluation_play_opens_a_training_play():
    """Each play starts with its own title page: a file put in the wrong split would show here."""
    titles = {
        split: {path.read_text().splitlines()[0] for path in paths} for split, paths in embedded_corpus_files().items()
    }
    assert titles["validation"] == {"MACBETH"}
    assert titles["test"] == {"THE TEMPEST"}
    assert not titles["train"] & (titles["validation"] | titles["test"])


def _non_blank_lines(paths):
    return [line for path in paths for line in path.read_text().splitlines() if line.strip()]


def test_corpus_loads_with_datasets_one_example_per_non_blank_line():
    corpus = load_embedded_corpus()
    assert set(corpus) == {"train", "validation", "test"}
    for split, paths in embedded_corpus_files().items():
        texts = corpus[split]["text"]
        assert len(texts) > 1000
        assert list(texts) == _non_blank_lines(paths)


def test_corpus_can_keep_blank_lines():
    corpus = load_embedded_corpus(keep_empty_lines=True)
    for split, paths in embedded_corpus_files().items():
        assert corpus[split].num_rows == sum(len(path.read_text().splitlines()) for path in paths)
        assert "" in list(corpus[split]["text"])
