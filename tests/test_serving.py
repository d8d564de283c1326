"""Serving: the looped format (`save_for_serving`) holds each distinct block once and says how often it runs; what it
cannot express is refused by name; llama.cpp's own converter and engine give the tied model's logits from it and from
the plain export (`to_untied`)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.models import GPT2, LLAMA, MISTRAL, QWEN2
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench` is a folder of the repository, not installed

from hf_layertie import save_for_serving  # noqa: E402
from hf_layertie.relaxed_ties import relax_ties
from hf_layertie.serving import LOOPED_ARCHITECTURE, LoopedLayout


def test_the_looped_export_is_the_tied_checkpoint_s_weights_with_a_config_that_loops_them(tmp_path):
    """`cycle:2` over 6 positions: 2 blocks stored, tensor for tensor those of the tied checkpoint, run 3 times, the
    final norm after the last loop only; transformers refuses the folder rather than run one loop."""
    model = LLAMA.tied_model([0, 1, 0, 1, 0, 1])
    assert save_for_serving(model, tmp_path / "serving") == LoopedLayout(blocks=2, loops=3, first_loop=(0, 1))
    model.save_pretrained(tmp_path / "tied")
    served, tied = load_file(tmp_path / "serving" / "model.safetensors"), load_file(tmp_path / "tied" / "model.safetensors")
    assert served.keys() == tied.keys() and all(torch.equal(served[name], tied[name]) for name in tied)
    assert {name.split(".")[2] for name in served if name.startswith("model.layers.")} == {"0", "1"}
    config = json.loads((tmp_path / "serving" / "config.json").read_text())
    assert config["architectures"] == [LOOPED_ARCHITECTURE] and config["model_type"] == "nanbeige"
    assert (config["num_hidden_layers"], config["num_loops"], config["skip_loop_final_norm"]) == (2, 3, True)
    assert "2 distinct Llama blocks stored once, run 3" in (tmp_path / "serving" / "README.md").read_text()
    from transformers import AutoConfig

    with pytest.raises(ValueError, match="nanbeige"):
        AutoConfig.from_pretrained(tmp_path / "serving")


@pytest.mark.parametrize("skipped", [[4, 5], [2, 3], [0, 1]])
def test_skipping_whole_loops_serves_fewer_loops(tmp_path, skipped):
    """Any whole loop left out (the computed blocks still run 0 1 0 1) serves 2 loops of the first loop computed."""
    model = LLAMA.tied_model([0, 1, 0, 1, 0, 1])
    model.config.skipped_positions = skipped
    first = (2, 3) if skipped == [0, 1] else (0, 1)
    assert save_for_serving(model, tmp_path) == LoopedLayout(blocks=2, loops=2, first_loop=first)
    assert json.loads((tmp_path / "config.json").read_text())["num_loops"] == 2
    with torch.no_grad():  # the export's first loop holds the weights of the positions it names
        exported = load_file(tmp_path / "model.safetensors")
        assert torch.equal(exported["model.layers.1.mlp.up_proj.weight"], model.model.layers[first[1]].mlp.up_proj.weight)


@pytest.mark.parametrize(
    "kind, tying_map, change, message",
    [
        (GPT2, [0, 1, 0, 1], None, r"checked for tied_llama, tied_qwen2, tied_mistral only, this model is a tied_gpt2"),
        (QWEN2, [0, 1, 0, 1], None, r"this tied_qwen2 attends over a sliding window of 4 tokens"),
        (MISTRAL, [0, 1, 0, 1], None, r"this tied_mistral attends over a sliding window of 4 tokens"),
        (LLAMA, [0, 0, 2, 2], None, r"map is 0 0 2 2 computing positions \[0, 1, 2, 3\]"),
        (LLAMA, [0, 1, 1, 1], None, r"map is 0 1 1 1"),
        (LLAMA, [0, 1, 0, 1], {"skipped_positions": [3]}, r"computing positions \[0, 1, 2\]"),
        (LLAMA, [0, 1, 0, 1, 0, 1], {"skipped_positions": [1]}, r"computing positions \[0, 2, 3, 4, 5\]"),
        (LLAMA, [0, 1, 0, 1], {"loop_residual_scale": True}, r"computes with loop_residual_scale, which no serving engine"),
        (LLAMA, [0, 1, 0, 1], "relaxed", r"per-position adapters \(relaxed ties\)"),
    ],
)
def test_what_the_looped_format_cannot_express_is_refused_before_anything_is_written(tmp_path, kind, tying_map, change, message):
    model = kind.tied_model(tying_map)
    if change == "relaxed":
        relax_ties(model, 1, "zero")
    elif change:
        for name, value in change.items():
            setattr(model.config, name, value)
    with pytest.raises(ValueError, match=message):
        save_for_serving(model, tmp_path / "serving")
    assert not (tmp_path / "serving").exists()


# --- through llama.cpp itself ----------------------------------------------------------------------------------------


def _llama_cpp():
    return pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed: pip install 'hf-layertie[serving]' (about 20 minutes of build; CI installs it)"
    )


def _served_logits(tmp_path, folder, name, prompts):
    from bench.serving import convert_to_gguf, gguf_logits

    gguf = convert_to_gguf(folder, tmp_path / f"{name}.gguf")
    return gguf, gguf_logits(gguf, prompts)


def _gguf_layers(gguf) -> int:
    """The number of layers whose weights a GGUF stores, from its tensor names (`blk.<i>.`)."""
    from bench.serving import gguf_tensors

    return len({tensor.name.split(".")[1] for tensor in gguf_tensors(gguf) if tensor.name.startswith("blk.")})


class _GgmlGelu(torch.nn.Module):
    """GPT-2's GELU (the tanh form) as ggml's CPU backend computes it: looked up in a half-precision table, its input
    and output rounded to float16 (`GGML_GELU_FP16` in ggml-cpu/vec.h), 0 below -10 and the identity above 10."""

    def forward(self, x):
        table = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, table))


def _logits_as_ggml_computes(model, prompt):
    """The tied model's logits; GPT-2's with ggml's GELU (`_GgmlGelu`), the one place llama.cpp's CPU arithmetic
    departs from float32 (by about 1e-3 per activation), so that what is left to compare is the export."""
    acts = {block: block.mlp.act for block in getattr(getattr(model, "transformer", None), "h", [])}
    try:
        for block in acts:
            block.mlp.act = _GgmlGelu()
        return model(torch.tensor([prompt])).logits[0].double().numpy()
    finally:
        for block, act in acts.items():
            block.mlp.act = act


@pytest.mark.e2e
@pytest.mark.parametrize(
    "kind, tying_map, window, exports",
    [
        (LLAMA, [0, 1, 0, 1, 0, 1], {}, ("looped", "untied")),
        # The plain Qwen2 and Mistral exports go through llama.cpp's converters of those classes, which do not take
        # the GPT-2 tokenizer of these tiny models; their looped exports are Llama-shaped.
        (QWEN2, [0, 1, 0, 1, 0, 1], {"use_sliding_window": False, "sliding_window": None}, ("looped",)),  # q/k/v biases
        (MISTRAL, [0, 1, 0, 1, 0, 1], {"sliding_window": None}, ("looped",)),
        (GPT2, [0, 1, 0, 1], {}, ("untied",)),
    ],
    ids=["llama", "qwen2", "mistral", "gpt2"],
)
def test_llama_cpp_serves_the_tied_model_s_logits_from_its_exports(tmp_path, kind, tying_map, window, exports):
    """llama.cpp's own converter and engine (f32 KV cache) give the tied model's logits within 1e-5: from the looped
    export, which stores 2 of the 6 layers (the Llama family without a sliding window), and from the plain export
    (Llama, GPT-2; GPT-2's reference computes its GELU as ggml does, whose half-precision table alone moves GPT-2's
    logits by about 5e-5 here)."""
    _llama_cpp()
    from hf_layertie.toolkit import load_tokenizer

    tokenizer = load_tokenizer("gpt2")  # a tokenizer llama.cpp's converter recognises
    sizes = dict(n_embd=32, n_head=4) if kind is GPT2 else dict(hidden_size=32, num_attention_heads=4, **window)
    model = kind.tied_model(tying_map, vocab_size=len(tokenizer), **sizes)
    prompts = torch.randint(0, len(tokenizer), (3, 12), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        expected = [_logits_as_ggml_computes(model, prompt) for prompt in prompts]
    if "looped" in exports:
        save_for_serving(model, tmp_path / "looped", tokenizer)
    if "untied" in exports:
        model.to_untied().save_pretrained(tmp_path / "untied")
        tokenizer.save_pretrained(tmp_path / "untied")
    if kind is GPT2:  # llama.cpp's converter reads GPT-2's context as `n_ctx`, which transformers 5 no longer writes
        config = json.loads((tmp_path / "untied" / "config.json").read_text())
        (tmp_path / "untied" / "config.json").write_text(json.dumps({**config, "n_ctx": config["n_positions"]}))
    for name in exports:
        gguf, logits = _served_logits(tmp_path, tmp_path / name, name, prompts)
        for ours, theirs in zip(logits, expected):
            assert np.abs(ours - theirs).max() < 1e-5, name
        assert _gguf_layers(gguf) == (2 if name == "looped" else len(tying_map))
