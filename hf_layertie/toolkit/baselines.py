"""Count-based baselines: the loss a model must beat before it has learned anything a table of counts cannot.

A causal language model that does not beat a count bigram of its own tokenization on held-out text has learned
little more than which token tends to follow which; the default runs print both losses side by side.

- `bigram_loss`: P(token | previous token) from counts of the training tokens, with interpolated absolute
  discounting (Ney et al., 1994; discount 0.75) onto an add-one unigram, so unseen pairs keep some mass.
  Scored on exactly the positions a causal model's evaluation loss covers: every token of a block after its first.
- `unigram_loss`: P(token) of the non-special tokens with add-one smoothing, scored on every non-special token:
  the expectation of a masked language model's loss for a predictor that ignores the context (masking picks the
  non-special tokens uniformly).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

DISCOUNT = 0.75


def _blocks(blocks: Iterable[Sequence[int]]) -> list[torch.Tensor]:
    """Each block as a tensor: lists of ids, or the rows of a `datasets` column in torch format (no Python int per
    token, which would take gigabytes for a large corpus)."""
    return [torch.as_tensor(block, dtype=torch.long) for block in blocks]


def _flat(blocks: Iterable[Sequence[int]]) -> torch.Tensor:
    parts = _blocks(blocks)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _unigram(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    counts = torch.bincount(tokens, minlength=vocab_size).double() + 1.0
    return counts / counts.sum()


def bigram_loss(train_blocks: Iterable[Sequence[int]], eval_blocks: Iterable[Sequence[int]], vocab_size: int) -> float:
    """Mean negative log-likelihood (nats per token) of the eval blocks under a count bigram of the train blocks."""
    train = _flat(train_blocks)
    unigram = _unigram(train, vocab_size)
    pair_keys, pair_counts = torch.unique(train[:-1] * vocab_size + train[1:], return_counts=True)
    context_counts = torch.bincount(train[:-1], minlength=vocab_size).double()
    context_types = torch.bincount(pair_keys // vocab_size, minlength=vocab_size).double()

    evaluated = _blocks(eval_blocks)
    previous, following = _flat(block[:-1] for block in evaluated), _flat(block[1:] for block in evaluated)
    keys = previous * vocab_size + following
    found = torch.searchsorted(pair_keys, keys).clamp(max=len(pair_keys) - 1)
    counts = torch.where(pair_keys[found] == keys, pair_counts[found], 0).double()
    seen = context_counts[previous]
    denominator = seen.clamp(min=1.0)
    backoff = torch.where(seen > 0, DISCOUNT * context_types[previous] / denominator, torch.ones_like(seen))
    probability = (counts - DISCOUNT).clamp(min=0.0) / denominator + backoff * unigram[following]
    return float(-probability.log().mean())


def unigram_loss(
    train_blocks: Iterable[Sequence[int]], eval_blocks: Iterable[Sequence[int]], vocab_size: int, special_ids: Iterable[int] = ()
) -> float:
    """Mean negative log-likelihood of the eval blocks' non-special tokens under an add-one unigram of the train
    blocks' non-special tokens. The collator masks no token of `all_special_ids` ([UNK] included: the mask it
    computes when the Trainer has dropped the tokenized `special_tokens_mask` column, as by default), so a masked
    model is never asked for one; counted, the [CLS] and [SEP] of every line would take a fifth of the mass from the
    tokens that are asked for."""
    special = torch.tensor(sorted(set(special_ids)), dtype=torch.long)
    train, tokens = _flat(train_blocks), _flat(eval_blocks)
    counts = torch.bincount(train[~torch.isin(train, special)], minlength=vocab_size).double() + 1.0
    counts[special] = 0.0
    unigram = counts / counts.sum()
    return float(-unigram[tokens[~torch.isin(tokens, special)]].log().mean())
