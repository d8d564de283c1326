"""Knowledge distillation from a frozen teacher: what `TyingTrainer` trains on when `distill_from` is set.

The loss (Hinton et al., 2015) mixes the student's next-token loss with the KL divergence from the teacher's token
distribution to the student's, both softened by a temperature T:

    loss = (1 - alpha) * CE(student, labels) + alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))

over the tokens the next-token loss scores: position t predicts label t + 1, labels of -100 are skipped. Each term
is a sum over those tokens divided by `num_items_in_batch`, the Trainer's count of them over the whole optimizer
step (every micro-batch, every process), so gradient accumulation and DDP average the mix exactly as they average
the plain loss. `Distillation` is the Trainer's `compute_loss_func`: the Trainer counts the tokens, scales the loss
for the processes and skips the division by the accumulation steps, as it does for a model's own loss.

The teacher (any causal checkpoint, tied or plain) is loaded once, in eval mode with its Parameters frozen, on the
student's device and in its dtype, and held here, outside the student: it is never in the optimizer, the DDP
wrapper, a checkpoint or the student's parameter counts. A resumed run loads it again from `distill_from`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
# The inputs the teacher reads from a training batch (labels are the loss's, not the teacher's).
TEACHER_INPUTS = ("input_ids", "attention_mask", "position_ids")
# Any of these in the teacher's folder means it has a tokenizer to compare with the student's.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model")
# The token ids a config records from the tokenizer it was built with: compared when the teacher has no tokenizer.
SPECIAL_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor | None,
    labels: torch.Tensor,
    temperature: float,
    alpha: float,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """`(1 - alpha) * CE + alpha * T^2 * KL(teacher_T || student_T)` over the tokens with a next-token label, each a
    sum divided by `num_items_in_batch` (their number over the optimizer step), or by their number here when None.

    Without teacher logits (evaluation), the next-token loss alone, as the model computes it: evaluation measures the
    student, not the mix. Logits are taken in float32, as transformers' causal loss takes them.
    """
    logits, targets = student_logits[:, :-1].float(), labels[:, 1:].to(student_logits.device)
    scored = targets != IGNORE_INDEX
    count = num_items_in_batch if num_items_in_batch is not None else scored.sum().clamp(min=1)
    if torch.is_tensor(count):
        count = count.to(logits.device)
    cross_entropy = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    if teacher_logits is None:
        return cross_entropy / count
    student_log_probs = F.log_softmax(logits[scored] / temperature, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits[:, :-1].float()[scored] / temperature, dim=-1)
    kl = F.kl_div(student_log_probs, teacher_log_probs, log_target=True, reduction="sum")
    return ((1 - alpha) * cross_entropy + alpha * temperature**2 * kl) / count


@dataclass
class Distillation:
    """The teacher and the loss settings; called as the Trainer's `compute_loss_func`.

    `observe(inputs)` runs the teacher on the micro-batch the student is about to train on; the next call scores the
    student's outputs against those logits and forgets them, so that logits never outlive their batch.
    """

    teacher: PreTrainedModel = field(repr=False)
    source: str
    temperature: float
    alpha: float
    _teacher_logits: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def load(cls, source: str, temperature: float, alpha: float, student, processing_class=None) -> Distillation:
        """Load the teacher from `source` on `student`'s device (until `observe` sees batches on another) and in its
        dtype, frozen, after refusing one whose vocabulary or tokenizer differs from the student's (the KL would
        compare different tokens)."""
        check_causal_student(student)
        first = next(student.parameters())
        teacher = load_teacher(source, first.dtype)
        check_same_vocabulary(source, teacher, student, processing_class)
        teacher.to(first.device).eval().requires_grad_(False)
        return cls(teacher, source, temperature, alpha)

    @property
    def parameters_mib(self) -> float:
        """The teacher's parameter memory in MiB: what distilling adds beside the student's training state."""
        return sum(parameter.numel() * parameter.element_size() for parameter in self.teacher.parameters()) / 2**20

    @torch.no_grad()
    def observe(self, inputs: dict) -> None:
        """Run the teacher on the micro-batch `inputs` (no gradients, eval mode: no dropout, no random draw), on the
        batch's device: the Trainer places some students only when training starts (`bf16_full_eval`, model
        parallelism), after the teacher was loaded beside them."""
        teacher_inputs = {name: inputs[name] for name in TEACHER_INPUTS if name in inputs}
        length, positions = teacher_inputs["input_ids"].shape[-1], getattr(self.teacher.config, "max_position_embeddings", None)
        if positions is not None and length > positions:
            raise ValueError(
                f"distill_from {self.source}: the teacher reads {positions} positions, and the batches hold {length} "
                f"tokens per row: train on blocks of at most {positions} tokens (--block_size), or distil from a "
                f"teacher with a longer context"
            )
        device = teacher_inputs["input_ids"].device
        if self.teacher.device != device:
            self.teacher.to(device)
        self._teacher_logits = self.teacher(**teacher_inputs).logits

    def __call__(self, outputs, labels: torch.Tensor, num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """The Trainer's `compute_loss_func`: the mixed loss of the observed micro-batch; without one (evaluation),
        the next-token loss."""
        teacher_logits, self._teacher_logits = self._teacher_logits, None
        student_logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if teacher_logits is not None and teacher_logits.shape != student_logits.shape:
            raise ValueError(
                f"distill_from {self.source}: the teacher's logits have shape {tuple(teacher_logits.shape)}, the "
                f"student's {tuple(student_logits.shape)}"
            )
        return distillation_loss(student_logits, teacher_logits, labels, self.temperature, self.alpha, num_items_in_batch)


def start_distillation(args, student, processing_class=None, compute_loss_func=None) -> Distillation | None:
    """With `args.distill_from`, load the teacher for `student` and return the mixed loss, which the trainer makes its
    `compute_loss_func` (so that the Trainer counts the scored tokens and scales the loss as it does the model's own);
    None without. Refused beside a `compute_loss_func` or label smoothing of the user's, and under DataParallel. Logs
    the teacher's memory once."""
    if args.distill_from is None:
        return None
    if compute_loss_func is not None or args.label_smoothing_factor != 0:
        raise ValueError(
            "distill_from replaces the training loss: leave compute_loss_func and label_smoothing_factor unset "
            "(the next-token term of the mix is the plain cross-entropy)"
        )
    if args.n_gpu > 1:
        raise ValueError(
            f"distill_from under torch.nn.DataParallel ({args.n_gpu} GPUs in one process): the Trainer scales a loss "
            "computed once on the gathered batch as if each GPU had computed its own, so the mix would count "
            f"{args.n_gpu} times. Launch one process per GPU (accelerate launch, or torchrun)"
        )
    distillation = Distillation.load(
        args.distill_from, args.distillation_temperature, args.distillation_alpha, student, processing_class
    )
    student_mib = sum(parameter.numel() * parameter.element_size() for parameter in student.parameters()) / 2**20
    logger.info(
        f"Distilling from {args.distill_from} (T={args.distillation_temperature}, alpha={args.distillation_alpha:.4g}): "
        f"the teacher holds {distillation.parameters_mib:,.2f} MiB of frozen parameters on {distillation.teacher.device}, outside "
        f"the student's training state (its parameters: {student_mib:,.2f} MiB, before gradients and optimizer state)"
    )
    return distillation


def check_causal_student(student) -> None:
    """Refuse a student whose loss is not transformers' causal one (`loss_type="ForCausalLM"`, every causal tied
    class): the Trainer counts shifted labels only for it, and a masked language model (BERT) scores other tokens
    than the next-token KL here would."""
    loss_type = getattr(student, "loss_type", None)
    if loss_type != "ForCausalLM":
        raise ValueError(
            f"distill_from distils causal language models (GPT-2, Llama, Qwen2, Mistral, tied or not), whose loss "
            f"scores the next token (loss_type 'ForCausalLM'); the student, a {type(student).__name__}, has loss_type "
            f"{loss_type!r}: masked language models (BERT) are not distilled. A plain causal model without it: set "
            f"model.loss_type = 'ForCausalLM'"
        )


def load_teacher(source: str, dtype: torch.dtype) -> PreTrainedModel:
    """The causal language model at `source` (folder or Hub id, tied or plain) in `dtype`; errors name the setting."""
    try:
        return AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"distill_from {source}: could not load a causal language model from it ({error})") from error


def check_same_vocabulary(source: str, teacher, student, processing_class=None) -> None:
    """Refuse a teacher whose vocabulary size, or (where both have one) tokenizer, differs from the student's, with
    one error naming both. A teacher saved without tokenizer files is compared by what its config records of its
    tokenizer (`_check_special_token_ids`)."""
    sizes = teacher.config.get_text_config().vocab_size, student.config.get_text_config().vocab_size
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"distill_from {source}: the teacher's vocabulary has {sizes[0]} tokens, the student's "
            f"({student.name_or_path or type(student).__name__}) {sizes[1]}: the KL compares distributions over the same "
            f"tokens, so the teacher must share the student's vocabulary and tokenizer"
        )
    student_tokenizer = getattr(processing_class, "tokenizer", processing_class)
    teacher_tokenizer = _teacher_tokenizer(source) if hasattr(student_tokenizer, "get_vocab") else None
    if teacher_tokenizer is None:
        _check_special_token_ids(source, teacher, student, student_tokenizer)
        return
    theirs, ours = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if theirs != ours:
        differing = next((token for token in sorted(theirs.keys() | ours.keys()) if theirs.get(token) != ours.get(token)))
        raise ValueError(
            f"distill_from {source}: the teacher's tokenizer ({len(theirs)} tokens) differs from the student's "
            f"({student_tokenizer.name_or_path or type(student_tokenizer).__name__}, {len(ours)} tokens): "
            f"{differing!r} is token {theirs.get(differing)} there and {ours.get(differing)} here; the teacher must "
            f"share the student's tokenizer"
        )


def _check_special_token_ids(source: str, teacher, student, student_tokenizer) -> None:
    """A teacher without a tokenizer: refuse it when its config's special token ids (those of the tokenizer it was
    built with) differ from the student's tokenizer's (its config's when it has none), since then the two were
    built with different tokenizers; else say that its tokens could not be compared."""
    theirs = teacher.config.get_text_config()
    ours = student_tokenizer if hasattr(student_tokenizer, "get_vocab") else student.config.get_text_config()
    differing = [
        f"{key} {getattr(theirs, key)} there and {getattr(ours, key)} here"
        for key in SPECIAL_TOKEN_IDS
        if None not in (getattr(theirs, key, None), getattr(ours, key, None)) and getattr(theirs, key) != getattr(ours, key)
    ]
    if differing:
        raise ValueError(
            f"distill_from {source}: the teacher was saved without tokenizer files, and its config's special token ids "
            f"differ from the student's ({'; '.join(differing)}): it was built with another tokenizer, and the KL "
            f"would compare different tokens. Distil from a teacher that shares the student's tokenizer"
        )
    logger.warning(
        f"distill_from {source}: the teacher was saved without tokenizer files ({', '.join(TOKENIZER_FILES)}), so only "
        f"its vocabulary size and special token ids could be compared with the student's (they agree); whether its "
        f"tokens are the student's is not known. Save the teacher's tokenizer beside it to have it checked"
    )


def _teacher_tokenizer(source: str):
    """The tokenizer saved with the teacher, None when it has none (a folder without tokenizer files)."""
    if os.path.isdir(source) and not any(os.path.isfile(os.path.join(source, name)) for name in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError):
        return None
