"""A non-RL tying strategy: tie the blocks that change their input least, measured on data.

Work on pruning, sharing and looping the layers of trained transformers measures how much each block
changes the hidden state it is given: ShortGPT's block influence (1 - cosine between a block's input and
output; Men et al., 2024), the angular distance of Gromov et al. (2024, "The Unreasonable Ineffectiveness of
the Deeper Layers"), and the block choices of retrofitted recurrence (McLeish et al., 2025) and
encode-think-decode (2025), which loop the middle blocks whose representations move least. A block that barely
moves its input is the cheapest one to replace.

`similarity_tying_map` keeps block 0 and the `num_distinct - 1` blocks with the largest angular distance
independent and ties every other block to the nearest independent block before it, so a low-influence block
repeats the previous distinct block (the looping of the works above). `TyingTrainer` runs it for
`tying_strategy="similarity:U"`; it also works on its own, e.g. to choose the map of a converted pretrained
checkpoint:

    distances = block_angular_distances(model, {"input_ids": ids})
    tying_map = similarity_tying_map(distances, num_distinct=4)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .checks import check_integer
from .models.tied_blocks import TiedBlocksMixin
from .models.tying_map import TyingMap


def _hidden_state(value) -> torch.Tensor:
    """The hidden states in a block's input or output (a tensor, or the first element of a tuple)."""
    return value if torch.is_tensor(value) else value[0]


@torch.no_grad()
def block_angular_distances(model: TiedBlocksMixin, inputs: Mapping[str, torch.Tensor]) -> list[float]:
    """Mean angular distance `arccos(cos(x_in, x_out)) / pi` between each block's input and output, per token.

    One forward pass over `inputs` in eval mode (the model's training mode is restored); padding positions
    (attention_mask 0) are left out. Returns one value in [0, 1] per block.
    """
    blocks = model.tied_blocks
    sums = [0.0 for _ in blocks]
    counts = [0 for _ in blocks]  # tokens measured, counted where the angles are (`input_ids` or `inputs_embeds`)
    mask = inputs.get("attention_mask")

    def measure(index: int):
        def hook(module, args, kwargs, output):
            before = _hidden_state(args[0] if args else kwargs["hidden_states"]).float()
            after = _hidden_state(output).float()
            cosine = torch.nn.functional.cosine_similarity(before, after, dim=-1).clamp(-1.0, 1.0)
            angles = torch.arccos(cosine) / torch.pi
            if mask is not None:
                angles = angles[mask.bool()]
            sums[index] += angles.sum().item()  # a Python float: float64 on every device (MPS has none)
            counts[index] += angles.numel()

        return hook

    handles = [block.register_forward_hook(measure(index), with_kwargs=True) for index, block in enumerate(blocks)]
    was_training = model.training
    model.eval()
    try:
        model(**{**{key: value for key, value in inputs.items() if key != "labels"}, "use_cache": False})
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    if not counts[0]:
        raise ValueError("block_angular_distances: the inputs hold no token to measure (attention_mask is all 0)")
    return [total / count for total, count in zip(sums, counts)]


def similarity_tying_map(distances: Sequence[float], num_distinct: int) -> TyingMap:
    """Block 0 and the `num_distinct - 1` blocks that move their input most stay independent; every other block
    uses the nearest independent block before it. Ties between equal distances go to the earlier block."""
    num_blocks = len(distances)
    check_integer("num_distinct", num_distinct, minimum=1)
    if not 1 <= num_distinct <= num_blocks:
        raise ValueError(f"num_distinct must be in 1..{num_blocks} for a model of {num_blocks} blocks, got {num_distinct}")
    ranked = sorted(range(1, num_blocks), key=lambda block: (-distances[block], block))
    independent = {0, *ranked[: num_distinct - 1]}
    entries = []
    for block in range(num_blocks):
        entries.append(block if block in independent else entries[block - 1])
    return TyingMap(entries)
