"""LAMBADA evaluation of a causal LM: last-word accuracy and target-word perplexity.

The protocol is lm-eval-harness `lambada_openai`'s: a passage is correct when greedy decoding from
its context produces every token of the target word. With teacher forcing this is the same as the
arg-max at each target position being the target token, so one forward pass per batch scores
every passage, with no generation loop.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..metrics import load_metric
from ..toolkit import this_process_share
from .reader import split_context_target


@dataclass(frozen=True)
class _EncodedPassage:
    token_ids: list[int]  # the last `num_target_tokens` of them are the target word
    num_target_tokens: int


@dataclass(frozen=True)
class _TargetScore:
    negative_log_likelihood: float
    greedy_ids: list[int]
    target_ids: list[int]


def evaluate_lambada(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    passages: Sequence[str],
    batch_size: int = 8,
    device: str | torch.device | None = None,
    show_progress: bool = True,
) -> dict[str, float | int]:
    """Score a causal LM on LAMBADA passages.

    Returns:
        `lambada_accuracy`: share of passages whose target word is predicted exactly;
        `lambada_perplexity`: exp(mean NLL per target-word TOKEN over all passages);
        `lambada_word_perplexity`: exp(mean NLL per target WORD), what lm-eval-harness reports as
            `perplexity` (it averages each passage's summed log-likelihood);
        `lambada_examples`: number of passages.

    Passages longer than the model's `max_position_embeddings` lose context on the left, as in
    lm-eval-harness. Under several processes each scores its share of the passages and every process gets the
    whole set's scores (collective: call it on every process). `device`, when given, moves the model there. The model is put in eval mode
    for the run and its training mode restored afterwards.
    """
    if not passages:
        raise ValueError("passages must hold at least one LAMBADA passage, got none")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if device is not None:
        model.to(device)
    max_length = getattr(model.config, "max_position_embeddings", None)
    encoded = [_encode_passage(tokenizer, passage, max_length, index) for index, passage in enumerate(passages)]
    # Longest first: similar lengths share a batch (little padding), and memory errors show at once.
    encoded.sort(key=lambda passage: len(passage.token_ids), reverse=True)
    batches = [encoded[start : start + batch_size] for start in range(0, len(encoded), batch_size)]

    own_batches = this_process_share(model, batches, "evaluate_lambada")
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            scores = [
                score
                for batch in tqdm(own_batches, desc="LAMBADA", unit="batch", disable=not (show_progress and PartialState().is_main_process))
                for score in _score_batch(model, batch)
            ]
    finally:
        model.train(was_training)
    return _aggregate(gather_object(scores))


def _encode_passage(
    tokenizer: PreTrainedTokenizerBase, passage: str, max_length: int | None, index: int
) -> _EncodedPassage:
    """Tokenise like lm-eval-harness: target tokens are those of the whole passage after the context's.

    No special tokens are added. At most `max_length + 1` tokens are kept: the last target token
    is only predicted, never fed to the model.
    """
    try:
        context, target = split_context_target(passage)
    except ValueError as error:
        raise ValueError(f"passages[{index}]: {error}") from None
    # Whole passages, cut to the model's context below: the tokenizer's warning about longer ones does not apply.
    token_ids = tokenizer(context + target, add_special_tokens=False, verbose=False)["input_ids"]
    num_target_tokens = len(token_ids) - len(tokenizer(context, add_special_tokens=False, verbose=False)["input_ids"])
    if num_target_tokens < 1:
        raise ValueError(f"passages[{index}]: target word {target!r} tokenises into no token of its own")
    if max_length is not None:
        if num_target_tokens > max_length:
            raise ValueError(
                f"passages[{index}]: target word {target!r} has {num_target_tokens} tokens, "
                f"more than the model's {max_length} positions"
            )
        token_ids = token_ids[-(max_length + 1) :]
    return _EncodedPassage(token_ids, num_target_tokens)


def _score_batch(model: PreTrainedModel, batch: list[_EncodedPassage]) -> list[_TargetScore]:
    """One forward pass over right-padded inputs; causal attention keeps padding out of real positions."""
    inputs = [passage.token_ids[:-1] for passage in batch]
    input_ids = torch.zeros((len(inputs), max(map(len, inputs))), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(inputs):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    logits = model(
        input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device), use_cache=False
    ).logits

    scores = []
    for row, passage in enumerate(batch):
        end, count = len(inputs[row]), passage.num_target_tokens
        log_probs = logits[row, end - count : end].float().log_softmax(dim=-1)
        target_ids = torch.tensor(passage.token_ids[-count:], device=log_probs.device)
        nll = -log_probs.gather(-1, target_ids[:, None]).sum().item()
        scores.append(_TargetScore(nll, log_probs.argmax(dim=-1).tolist(), target_ids.tolist()))
    return scores


def _aggregate(scores: list[_TargetScore]) -> dict[str, float | int]:
    accuracy = load_metric("lambada_accuracy").compute(
        predictions=[score.greedy_ids for score in scores], references=[score.target_ids for score in scores]
    )
    perplexity = load_metric("perplexity_from_nll")
    nlls = [score.negative_log_likelihood for score in scores]
    per_token = perplexity.compute(
        negative_log_likelihoods=nlls, token_counts=[len(score.target_ids) for score in scores]
    )
    per_word = perplexity.compute(negative_log_likelihoods=nlls, token_counts=[1] * len(scores))
    return {
        "lambada_accuracy": accuracy["accuracy"],
        "lambada_perplexity": per_token["perplexity"],
        "lambada_word_perplexity": per_word["perplexity"],
        "lambada_examples": len(scores),
    }
