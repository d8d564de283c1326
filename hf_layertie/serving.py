"""A tied model for serving engines: the looped format, each distinct block stored once.

Serving engines share one format for looped models, Nanbeige4.2's (llama.cpp, SGLang, MLX, vLLM's Transformers
backend): a Llama checkpoint of U layers whose config says `num_loops = n`. The engine runs the U layers n times in
order, with a KV-cache slot per loop and layer, and with `skip_loop_final_norm` the final norm once, after the last
loop. A tied Llama whose map is `cycle:U` over L = nU positions computes exactly that, so its export is the plain
model of its first loop (`to_untied(positions=...)`) with that config: U blocks on disk instead of L. Without
`skip_loop_final_norm: true` written out, llama.cpp applies the final norm between loops too.

Which tied classes fit is what llama.cpp's converter and engine were checked with (tests/test_serving.py):
`LOOPED_SERVING_TYPES`, the Llama family, whose layers llama.cpp reads as Llama's (Qwen2's attention biases
included), without a sliding window: a window that binds (Mistral's `sliding_window`, Qwen2's layers past
`max_window_layers`) moved the logits by 0.3 to 0.6 in llama.cpp. Any other map, class, window, per-position adapters
(relaxed ties) or loop recipe is refused, naming it and pointing to `to_untied()`, which every engine reads as a
plain model with every position stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from .models import TiedBlocksMixin
from .models.adapter_export import is_adapter_layer
from .models.configuration_tying import LOOP_RECIPE_FIELDS

# The architecture serving engines read the looped format under (llama.cpp's converter: `NanbeigeForCausalLM`).
LOOPED_ARCHITECTURE = "NanbeigeForCausalLM"
# The model type written with it: not "llama", so that transformers refuses the folder rather than load it as a
# plain Llama of one loop (another function). llama.cpp's converter reads the file itself then.
LOOPED_MODEL_TYPE = "nanbeige"
# Tied classes whose looped export llama.cpp reads with the tied model's logits (tests/test_serving.py).
LOOPED_SERVING_TYPES = ("tied_llama", "tied_qwen2", "tied_mistral")


@dataclass(frozen=True)
class LoopedLayout:
    """A map llama.cpp's looped format expresses: `blocks` distinct blocks run `loops` times in turn, those of the
    positions `first_loop`."""

    blocks: int
    loops: int
    first_loop: tuple[int, ...]


_PLAIN = "export it with model.to_untied().save_pretrained(folder), which every engine reads with each block stored"


def check_servable_model(model) -> None:
    """Refuse, whatever the map, what the looped format cannot serve and training does not change: a class it was not
    checked with (`LOOPED_SERVING_TYPES`), attention over a sliding window shorter than the context, the loop recipe,
    per-position adapters (relaxed ties)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    if model_type not in LOOPED_SERVING_TYPES:
        raise ValueError(f"save_for_serving: the looped format is checked for {', '.join(LOOPED_SERVING_TYPES)} only, this model is a {model_type}; {_PLAIN}")
    window, layer_types = getattr(config, "sliding_window", None), getattr(config, "layer_types", None)
    if window is not None and window < config.max_position_embeddings and (layer_types is None or "sliding_attention" in layer_types):
        raise ValueError(
            f"save_for_serving: this {model_type} attends over a sliding window of {window} tokens, which llama.cpp's "
            f"looped format does not compute; {_PLAIN}"
        )
    recipe = [name for name in LOOP_RECIPE_FIELDS if getattr(config, name)]
    if recipe:
        raise ValueError(f"save_for_serving: this model computes with {', '.join(recipe)}, which no serving engine computes: serve it with this package")
    if any(is_adapter_layer(module) for module in model.modules()):
        raise ValueError(f"save_for_serving: per-position adapters (relaxed ties) make each loop differ, which the looped format cannot express; {_PLAIN}")


def looped_layout(model: TiedBlocksMixin) -> LoopedLayout:
    """`model`'s layout in the looped serving format, or a `ValueError` naming what it cannot express and pointing to
    `to_untied()`: `check_servable_model`, and the blocks of the positions computed must run U distinct blocks n times
    in turn (a `cycle:U` map; skipped positions, if any, leave whole loops)."""
    check_servable_model(model)
    entries, active = model.tying_map.to_list(), model.active_positions()
    computed = [entries[position] for position in active]
    blocks = len(set(computed))
    if len(computed) % blocks or computed != computed[:blocks] * (len(computed) // blocks):
        raise ValueError(
            f"save_for_serving: the looped format runs U blocks n times in turn (map cycle:U over the computed "
            f"positions); this model's map is {model.tying_map.render()} computing positions {active}; {_PLAIN}"
        )
    return LoopedLayout(blocks=blocks, loops=len(computed) // blocks, first_loop=tuple(active[:blocks]))


def save_for_serving(model: TiedBlocksMixin, folder: str | Path, tokenizer: PreTrainedTokenizerBase | None = None) -> LoopedLayout:
    """Write `model` in the looped serving format into `folder` (its U distinct blocks once, `config.json` with
    `num_loops`), with `tokenizer`'s files and a README that says how to convert and run it; return its layout.
    Refused, before anything is written, for what the format cannot express (`looped_layout`)."""
    layout = looped_layout(model)
    folder = Path(folder)
    model.to_untied(positions=list(layout.first_loop)).save_pretrained(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config.update(
        architectures=[LOOPED_ARCHITECTURE],
        model_type=LOOPED_MODEL_TYPE,
        num_loops=layout.loops,
        skip_loop_final_norm=True,
    )
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(_serving_card(layout, len(model.tying_map)))
    return layout


def _serving_card(layout: LoopedLayout, positions: int) -> str:
    return f"""# A looped model for serving

Exported by hf-layertie (`save_for_serving`): {layout.blocks} distinct Llama blocks stored once, run {layout.loops}
times in turn ({positions} positions of the tied model; `config.json`: `num_loops: {layout.loops}`,
`skip_loop_final_norm: true`, architecture `{LOOPED_ARCHITECTURE}`, the looped format of llama.cpp, SGLang, MLX
and vLLM's Transformers backend). transformers does not load this folder (it would run one loop): load the tied
checkpoint, or its `to_untied()` export, instead.

Convert it with llama.cpp's converter (in llama.cpp's repository, or in llama-cpp-python's source distribution
under `vendor/llama.cpp/`) and run it:

```bash
python convert_hf_to_gguf.py THIS_FOLDER --outtype f32 --outfile model.gguf
llama-cli -m model.gguf -p "Your prompt"
```

The logits equal the tied model's with an f32 KV cache (`type_k`/`type_v` f32); llama.cpp's default f16 cache
moves them slightly. See hf-layertie's docs/serving.md.
"""
