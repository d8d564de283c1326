"""LAMBADA: reading the OpenAI file, the lm-eval split, and evaluation of models whose answers are known.

The known answers come from tiny GPT-2s (plain and tied, real GPT-2 vocabulary) trained for a few
seconds to produce the last word of four passages; greedy generation confirms what they produce
before `evaluate_lambada` is scored against it, and perplexities are recomputed here one passage at a
time, without padding or batching.
"""

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel
from hf_layertie.data import LAMBADA_TEST_FILE, embedded_tokenizer_dir
from hf_layertie.lambada import (
    evaluate_lambada,
    lambada_causal_lm_dataset,
    lambada_finetune_split,
    read_lambada_jsonl,
    split_context_target,
)

GPT2_TOKENIZER_DIR = embedded_tokenizer_dir("gpt2")
N_POSITIONS = 32

MEMORISED = [
    "The children went outside in the cold and together they built a snowman",  # " snow" + "man"
    "After dinner the old captain climbed the stairs to light the lamp of his lighthouse",
    "Every morning my grandmother waters the roses in her garden",
    "On warm summer nights the dark field glowed with fireflies",  # " fire" + "flies"
]
WRONG_WORD = MEMORISED[2].replace("garden", "kitchen")
WRONG_SECOND_TOKEN = MEMORISED[0].replace("snowman", "snowfall")  # " snow" + "fall": first token right
MIXED = [*MEMORISED, WRONG_WORD, WRONG_SECOND_TOKEN]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """On 2 shared cores, intra-op threads spin-wait: one thread trains these tiny models ~10x faster."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tokenizer():
    return GPT2TokenizerFast.from_pretrained(GPT2_TOKENIZER_DIR)


def tiny_causal_lm(kind: str, vocab_size: int):
    torch.manual_seed(0)
    settings = dict(
        n_layer=2, n_embd=16, n_head=2, vocab_size=vocab_size, n_positions=N_POSITIONS,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=50256, eos_token_id=50256,
    )  # fmt: skip
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(**settings))
    return TiedGPT2LMHeadModel(TiedGPT2Config(**settings, tying_map=[0, 0]))


def encode_context_and_target(tokenizer, passage: str) -> tuple[list[int], list[int]]:
    """Independent of the library: context and " " + last word tokenised separately."""
    context, word = passage.rsplit(" ", 1)
    return tokenizer(context)["input_ids"], tokenizer(" " + word)["input_ids"]


def train_on_target_words(model, tokenizer, passages, max_steps=300):
    """Teach the model each passage's last word from its context (loss on the target tokens only)."""
    pairs = [encode_context_and_target(tokenizer, passage) for passage in passages]
    width = max(len(context) + len(target) for context, target in pairs)
    input_ids = torch.zeros((len(pairs), width), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for row, (context, target) in enumerate(pairs):
        input_ids[row, : len(context) + len(target)] = torch.tensor(context + target)
        attention_mask[row, : len(context) + len(target)] = 1
        labels[row, len(context) : len(context) + len(target)] = torch.tensor(target)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    model.train()
    for _ in range(max_steps):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        if loss.item() < 0.02:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.02, f"the tiny model did not learn the target words (loss {loss.item():.3f})"
    return model.eval()


@pytest.fixture(scope="module", params=["gpt2", "tied_gpt2"])
def memorising_model(request, tokenizer):
    return train_on_target_words(tiny_causal_lm(request.param, len(tokenizer)), tokenizer, MEMORISED)


def greedy_generation_is_correct(model, tokenizer, passage: str) -> bool:
    """The protocol's definition, literally: greedy decoding from the context yields the target tokens."""
    context, target = encode_context_and_target(tokenizer, passage)
    generated = model.generate(
        torch.tensor([context]), max_new_tokens=len(target), do_sample=False, pad_token_id=tokenizer.eos_token_id
    )
    return generated[0, len(context) :].tolist() == target


def reference_scores(model, tokenizer, passages, max_length=N_POSITIONS):
    """Per passage, unbatched and unpadded: (summed target NLL, number of target tokens)."""
    scores = []
    for passage in passages:
        context, target = encode_context_and_target(tokenizer, passage)
        kept = (context + target)[-(max_length + 1) :]
        with torch.no_grad():
            logits = model(torch.tensor([kept[:-1]])).logits[0, -len(target) :]
        log_probs = logits.log_softmax(dim=-1)[torch.arange(len(target)), torch.tensor(target)]
        scores.append((-log_probs.sum().item(), len(target)))
    return scores


# --- evaluation ------------------------------------------------------------------------------


def test_memorised_passages_score_full_accuracy(memorising_model, tokenizer):
    assert all(greedy_generation_is_correct(memorising_model, tokenizer, passage) for passage in MEMORISED)
    result = evaluate_lambada(memorising_model, tokenizer, MEMORISED, show_progress=False)
    assert result["lambada_accuracy"] == 1.0
    assert result["lambada_examples"] == 4


def test_changed_target_word_scores_zero(memorising_model, tokenizer):
    assert not greedy_generation_is_correct(memorising_model, tokenizer, WRONG_WORD)
    assert evaluate_lambada(memorising_model, tokenizer, [WRONG_WORD], show_progress=False)["lambada_accuracy"] == 0.0


def test_target_right_in_its_first_token_only_counts_as_wrong(memorising_model, tokenizer):
    context, wrong_target = encode_context_and_target(tokenizer, WRONG_SECOND_TOKEN)
    _, memorised_target = encode_context_and_target(tokenizer, MEMORISED[0])
    assert len(wrong_target) == 2 and wrong_target[0] == memorised_target[0] != wrong_target[1]
    with torch.no_grad():
        first_prediction = memorising_model(torch.tensor([context])).logits[0, -1].argmax().item()
    assert first_prediction == wrong_target[0]  # the first token IS predicted right

    result = evaluate_lambada(memorising_model, tokenizer, [WRONG_SECOND_TOKEN], show_progress=False)
    assert result["lambada_accuracy"] == 0.0


@pytest.mark.parametrize("batch_size", [1, 4, 8])
def test_accuracy_and_perplexity_match_unbatched_computation(memorising_model, tokenizer, batch_size):
    expected_accuracy = sum(greedy_generation_is_correct(memorising_model, tokenizer, p) for p in MIXED) / len(MIXED)
    assert expected_accuracy == 4 / 6
    scores = reference_scores(memorising_model, tokenizer, MIXED)
    total_nll = sum(nll for nll, _ in scores)

    result = evaluate_lambada(memorising_model, tokenizer, MIXED, batch_size=batch_size, show_progress=False)

    assert result["lambada_accuracy"] == pytest.approx(expected_accuracy)
    assert result["lambada_perplexity"] == pytest.approx(math.exp(total_nll / sum(n for _, n in scores)), rel=1e-5)
    assert result["lambada_word_perplexity"] == pytest.approx(math.exp(total_nll / len(scores)), rel=1e-5)
    assert result["lambada_examples"] == len(MIXED)


def test_real_passages_longer_than_the_model_lose_context_on_the_left(memorising_model, tokenizer):
    passages = read_lambada_jsonl(LAMBADA_TEST_FILE)[:8]
    assert min(len(tokenizer(passage)["input_ids"]) for passage in passages) > N_POSITIONS + 1
    scores = reference_scores(memorising_model, tokenizer, passages)
    expected = math.exp(sum(nll for nll, _ in scores) / sum(n for _, n in scores))

    result = evaluate_lambada(memorising_model, tokenizer, passages, batch_size=3, show_progress=False)

    assert result["lambada_perplexity"] == pytest.approx(expected, rel=1e-5)
    assert result["lambada_examples"] == 8


def test_evaluation_restores_training_mode(memorising_model, tokenizer):
    memorising_model.train()
    try:
        evaluate_lambada(memorising_model, tokenizer, MEMORISED[:1], show_progress=False)
        assert memorising_model.training
    finally:
        memorising_model.eval()


@pytest.mark.parametrize(
    ("passages", "batch_size", "message"),
    [
        ([], 8, "at least one LAMBADA passage"),
        (MEMORISED, 0, "batch_size must be >= 1, got 0"),
        ([MEMORISED[0], "lonely"], 8, r"passages\[1\]: .*needs context"),
    ],
)
def test_bad_evaluation_input_is_rejected_clearly(memorising_model, tokenizer, passages, batch_size, message):
    with pytest.raises(ValueError, match=message):
        evaluate_lambada(memorising_model, tokenizer, passages, batch_size=batch_size, show_progress=False)


# --- reading ---------------------------------------------------------------------------------


def test_reads_the_real_openai_file():
    passages = read_lambada_jsonl(LAMBADA_TEST_FILE)
    assert len(passages) == 5153
    context, target = split_context_target(passages[0])
    assert target == " signs"
    assert context.endswith("I don't care about")


def test_split_keeps_a_last_chunk_with_newlines_whole():
    assert split_context_target("It was some kind of\n\nPower") == ("It was some kind", " of\n\nPower")


@given(text=st.text(st.sampled_from("ab \n.")))
def test_split_is_lm_eval_harness_lambada_openai_rule(text):
    """lm-eval: context = text.split(' ')[:-1] joined by ' ', target = ' ' + text.split(' ')[-1]."""
    chunks = text.split(" ")
    try:
        context, target = split_context_target(text)
    except ValueError:
        assert len(chunks) == 1 or not " ".join(chunks[:-1]).strip() or not chunks[-1].strip()
        return
    assert (context, target) == (" ".join(chunks[:-1]), " " + chunks[-1])


words = st.text(st.characters(blacklist_characters=" "), min_size=1).filter(str.strip)
contexts = st.text(min_size=1).filter(str.strip)


@given(context=contexts, word=words)
def test_split_context_target_recovers_context_and_spaced_word(context, word):
    assert split_context_target(f"{context} {word}") == (context, " " + word)


@settings(max_examples=25)
@given(passages=st.lists(st.builds("{} {}".format, contexts, words), min_size=1, max_size=5))
def test_reader_round_trips_json_lines(passages):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "lambada.jsonl"
        path.write_text("".join(json.dumps({"text": passage}) + "\n" for passage in passages))
        assert read_lambada_jsonl(path) == passages


GOOD_LINE = json.dumps({"text": MEMORISED[0]})


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"text": "no closing quote}', "not valid JSON"),
        ('{"txt": "a typo in the key"}', 'expected a JSON object with a "text" key'),
        ('["a list", "not an object"]', 'expected a JSON object with a "text" key'),
        ('{"text": 42}', '"text" must be a string, got int'),
        ('{"text": ""}', "must not be empty"),
        ('{"text": "lonely"}', "needs context before its last word"),
        ('{"text": "ends with a space "}', "must end with a word"),
    ],
)
def test_malformed_line_error_names_file_line_and_problem(tmp_path, bad_line, problem):
    path = tmp_path / "broken.jsonl"
    path.write_text(f"{GOOD_LINE}\n\n{bad_line}\n{GOOD_LINE}\n")
    with pytest.raises(ValueError) as error:
        read_lambada_jsonl(path)
    assert str(error.value).startswith(f"{path}, line 3: ")
    assert problem in str(error.value)


def test_binary_file_error_names_file_and_line(tmp_path):
    path = tmp_path / "lambada_test.jsonl.gz"
    path.write_bytes(f"{GOOD_LINE}\n".encode() + b"\x1f\x8b\x08\x00 compressed\n")
    with pytest.raises(ValueError) as error:
        read_lambada_jsonl(path)
    assert str(error.value) == (
        f"{path}, line 2: not UTF-8 text (byte 1 is b'\\x8b'); expected JSON lines, is the file binary or compressed?"
    )


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "spaced.jsonl"
    path.write_text(f"{GOOD_LINE}\n\n   \n{GOOD_LINE}\n")
    assert read_lambada_jsonl(path) == [MEMORISED[0], MEMORISED[0]]


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"LAMBADA file not found: .*nowhere.jsonl \(run_lambada.py reads it from --lambada_file\)"):
        read_lambada_jsonl(tmp_path / "nowhere.jsonl")


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no passages"):
        read_lambada_jsonl(path)


# --- fine-tuning data ------------------------------------------------------------------------


@given(size=st.integers(2, 300), eval_fraction=st.floats(0.01, 0.99))
def test_finetune_split_holds_out_a_fixed_tail(size, eval_fraction):
    passages = [f"passage {index}" for index in range(size)]
    num_eval = max(1, round(size * eval_fraction))
    if num_eval >= size:
        with pytest.raises(ValueError, match="leaves no passage to train on"):
            lambada_finetune_split(passages, eval_fraction)
        return
    train, held_out = lambada_finetune_split(passages, eval_fraction)
    assert train + held_out == passages
    assert len(held_out) == num_eval
    assert lambada_finetune_split(passages, eval_fraction) == (train, held_out)


def test_finetune_split_of_the_real_file_is_documented_and_scores_no_text_fine_tuning_read(caplog):
    """Passages of one novel overlap: 13 of the last 515 share a run of 8 words with a training passage (7 end on
    words a training passage holds, target included) and are not scored."""
    passages = read_lambada_jsonl(LAMBADA_TEST_FILE)
    with caplog.at_level("WARNING"):
        train, held_out = lambada_finetune_split(passages)
    assert (len(train), len(held_out)) == (4638, 502) and train == passages[:4638]
    assert "13 of the 515 held-out LAMBADA passages share a run of 8 words with a training passage" in caplog.text
    assert set(held_out) <= set(passages[-515:])
    trained = {" ".join(words[start : start + 8]) for words in map(str.split, train) for start in range(len(words) - 7)}
    assert not any(" ".join(words[start : start + 8]) in trained for words in map(str.split, held_out) for start in range(len(words) - 7))


def test_a_held_out_passage_sharing_words_with_a_trained_one_is_not_scored():
    trained = "she opened the door and looked out at the garden where zoe waited"
    passages = [trained, "a passage of its own", "he said that she looked out at the garden where zoe waited", "nothing shared here"]
    assert lambada_finetune_split(passages, 0.5) == ([trained, "a passage of its own"], ["nothing shared here"])


@pytest.mark.parametrize("eval_fraction", [0.0, 1.0, -0.1])
def test_finetune_split_rejects_fractions_outside_zero_one(eval_fraction):
    with pytest.raises(ValueError, match="eval_fraction must be strictly between 0 and 1"):
        lambada_finetune_split(MEMORISED, eval_fraction)


def test_causal_lm_examples_keep_the_target_word_when_truncated(tokenizer):
    passages = read_lambada_jsonl(LAMBADA_TEST_FILE)[:6] + MEMORISED[2:3]
    dataset = lambada_causal_lm_dataset(passages, tokenizer, block_size=16)
    assert dataset.column_names == ["input_ids", "attention_mask"]
    for passage, example in zip(passages, dataset):
        _, target = encode_context_and_target(tokenizer, passage)
        full = tokenizer(passage)["input_ids"]
        assert example["input_ids"] == full[-16:]
        assert example["input_ids"][-len(target) :] == target
        assert example["attention_mask"] == [1] * len(example["input_ids"])
    assert len(dataset[-1]["input_ids"]) < 16  # a short passage is kept whole


def test_causal_lm_examples_train_through_the_standard_collator(memorising_model):
    tokenizer = GPT2TokenizerFast.from_pretrained(GPT2_TOKENIZER_DIR)
    tokenizer.pad_token = tokenizer.eos_token
    dataset = lambada_causal_lm_dataset(MEMORISED, tokenizer, block_size=N_POSITIONS)
    batch = DataCollatorForLanguageModeling(tokenizer, mlm=False)(list(dataset))
    with torch.no_grad():
        loss = memorising_model(**batch).loss
    assert torch.isfinite(loss) and loss.item() > 0


def test_fine_tuning_over_a_finished_run_without_checkpoints_is_refused_before_loading_anything(tmp_path):
    from hf_layertie.lambada.run import run_lambada

    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    with pytest.raises(ValueError, match=r"holds a run trained to step 10, and no checkpoint-N to continue it from"):
        run_lambada(["--model_name_or_path", "someone/never-loaded", "--output_dir", str(tmp_path), "--do_train"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--do_eval", "--block_size", "64"], "--block_size is read only with --do_train, which this run does not pass"),
        (["--do_eval", "--eval_fraction", "0.2"], "--eval_fraction is read only with --do_train"),
        (["--do_train", "--do_eval", "false", "--max_eval_passages", "5"], "--max_eval_passages is read only with --do_eval"),
        (["--do_eval", "--tying_strategy", "static:all"], "--tying_strategy is read only in training, and this run does not pass --do_train"),
        (["--do_train", "--eval_fraction", "1.5"], r"--eval_fraction must be strictly between 0 and 1, got 1.5"),
        (["--do_train", "--eval_strategy", "steps"], r"--eval_strategy steps: run_lambada scores the held-out passages once"),
    ],
)
def test_run_lambada_refuses_a_setting_its_run_would_not_read(tmp_path, flags, message):
    from hf_layertie.lambada.run import run_lambada

    with pytest.raises(ValueError, match=message):
        run_lambada(["--model_name_or_path", "someone/never-loaded", "--output_dir", str(tmp_path), *flags])
