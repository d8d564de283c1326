"""The tokenizers and corpus shipped in the package: right ids, a leak-free split by play, real loading."""

import hashlib
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_layertie.data import (
    LAMBADA_TEST_FILE,
    SHAKESPEARE_SPLITS,
    embedded_corpus_files,
    embedded_tokenizer_dir,
    load_embedded_corpus,
    load_embedded_tokenizer,
)
from hf_layertie.data.build_tokenizers import VOCABULARY_SIZE, build
from hf_layertie.data.embedded import DATA_DIR, SHAKESPEARE_DIR
from hf_layertie.lambada import read_lambada_jsonl

# Known ids of the original tokenizers, as the Hub's copies give them.
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
    with pytest.raises(ValueError, match=r"one of \['bert-base-uncased', 'gpt2', 'shakespeare-bpe', 'shakespeare-wordpiece'\], got 'gpt3'"):
        load_embedded_tokenizer("gpt3")


def test_the_shakespeare_tokenizers_are_small_and_keep_their_special_tokens():
    bpe, wordpiece = load_embedded_tokenizer("shakespeare-bpe"), load_embedded_tokenizer("shakespeare-wordpiece")
    assert len(bpe) == len(wordpiece) == VOCABULARY_SIZE
    assert bpe.eos_token == "<|endoftext|>" and bpe.pad_token is None
    assert (wordpiece.mask_token, wordpiece.pad_token, wordpiece.cls_token) == ("[MASK]", "[PAD]", "[CLS]")
    line = "When shall we three meet again?\n"
    assert bpe.decode(bpe(line)["input_ids"]) == line  # byte-level: lossless, line breaks included
    assert len(bpe(line)["input_ids"]) == 8  # whole common words: one token each


def test_the_build_script_reproduces_the_shipped_tokenizers(tmp_path):
    build(tmp_path)
    bpe = "tokenizers/shakespeare-bpe/tokenizer.json"
    assert (tmp_path / "shakespeare-bpe" / "tokenizer.json").read_bytes() == (DATA_DIR / bpe).read_bytes()
    # WordPiece training orders the initial alphabet differently from run to run; the vocabulary is the same.
    rebuilt = AutoTokenizer.from_pretrained(tmp_path / "shakespeare-wordpiece").get_vocab()
    assert set(rebuilt) == set(load_embedded_tokenizer("shakespeare-wordpiece").get_vocab())


def test_readme_checksums_match_the_shipped_files():
    readme = (DATA_DIR / "README.md").read_text()
    listed = dict(re.findall(r"`([\w./-]+)`[^\n]*`([0-9a-f]{64})`", readme))
    shipped = [*DATA_DIR.rglob("*.txt"), *DATA_DIR.rglob("*.json"), *DATA_DIR.rglob("*.jsonl")]
    checksummed = [path for path in shipped if path.name != "tokenizer_config.json"]
    assert {str(path.relative_to(DATA_DIR)) for path in checksummed} == set(listed)
    for path in checksummed:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == listed[str(path.relative_to(DATA_DIR))], path


def test_readme_counts_are_those_of_the_loaded_corpus():
    """Characters and `shakespeare-bpe` tokens per split, as the scripts read them: line by line."""
    readme = (DATA_DIR / "README.md").read_text()
    listed = {split: (int(chars.replace(",", "")), int(tokens.replace(",", ""))) for split, chars, tokens in re.findall(r"^\| (train|validation|test) \|[^|]*\| ([\d,]+) \| ([\d,]+) \|$", readme, re.M)}
    corpus, tokenizer = load_embedded_corpus(), load_embedded_tokenizer("shakespeare-bpe")
    for split in ("train", "validation", "test"):
        lines = corpus[split]["text"]
        assert listed[split] == (sum(map(len, lines)), sum(map(len, tokenizer(list(lines))["input_ids"]))), split


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


def test_corpus_loads_with_datasets_one_example_per_line_with_its_line_break():
    corpus = load_embedded_corpus()
    assert set(corpus) == {"train", "validation", "test"}
    for split, paths in embedded_corpus_files().items():
        texts = corpus[split]["text"]
        assert "".join(texts) == "".join(path.read_text(encoding="utf-8") for path in paths)
        assert len(texts) > 3000 and "\n" in list(texts)


def test_lambada_ships_with_its_licence_and_the_known_count():
    assert LAMBADA_TEST_FILE.is_file() and (LAMBADA_TEST_FILE.parent / "LICENSE").is_file()
    assert "CC BY 4.0" in (LAMBADA_TEST_FILE.parent / "LICENSE").read_text()
    assert len(read_lambada_jsonl(LAMBADA_TEST_FILE)) == 5153


def test_nothing_in_the_repository_reads_the_shared_folder_beside_it():
    repository = Path(__file__).resolve().parents[2]
    sources = [*repository.glob("*.py"), *repository.glob("hf_layertie/**/*.py"), *repository.glob("bench/**/*.py"),
               *repository.glob("tests/**/*.py"), *repository.glob("model_cards/*.py"), repository / ".ci" / "run"]  # fmt: skip
    pattern = re.compile(r"""["'/]shared["'/]""")
    this_test = Path(__file__).resolve()
    offenders = [
        str(path.relative_to(repository))
        for path in sources
        if path != this_test and pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
