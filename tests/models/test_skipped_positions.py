"""Depth chosen per run and per call (`config.skipped_positions`, `skipped_positions=` on `forward` and `generate`):
a skipped position is the identity, and the model computes as the shorter model holding only the other positions."""

import pytest
import torch
from helpers.models import GPT2, LLAMA, MISTRAL, QWEN2

CAUSAL_KINDS = pytest.mark.parametrize("kind", [GPT2, LLAMA, QWEN2, MISTRAL], ids=lambda kind: kind.name)
PROMPT = torch.tensor([[5, 9, 2, 7, 11, 3]])


def shorter_model(kind, model, positions):
    """A tied model of `len(positions)` independent blocks holding `model`'s blocks at `positions`, in order: the
    model a skipping one must compute as, built without the feature under test."""
    shorter = kind.tied_model(None, num_blocks=len(positions))
    prefix = f"{kind.blocks_path}."
    weights = {}
    for name, tensor in model.state_dict().items():
        if not name.startswith(prefix):
            weights[name] = tensor
            continue
        position, _, rest = name[len(prefix) :].partition(".")
        if int(position) in positions:
            weights[f"{prefix}{positions.index(int(position))}.{rest}"] = tensor
    shorter.load_state_dict(weights)
    return shorter.eval()


@CAUSAL_KINDS
@pytest.mark.parametrize("skipped", [[2, 3], [0], [1, 3]])
def test_skipped_positions_compute_as_the_shorter_model_in_forward_and_cached_generation(kind, skipped):
    model = kind.tied_model([0, 1, 1, 1], seed=3)
    active = [position for position in range(4) if position not in skipped]
    shorter = shorter_model(kind, model, active)
    with torch.no_grad():
        torch.testing.assert_close(model(PROMPT, skipped_positions=skipped).logits, shorter(PROMPT).logits, rtol=0, atol=0)
        assert not torch.equal(model(PROMPT).logits, shorter(PROMPT).logits)  # the full depth differs
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    generated = model.generate(PROMPT, skipped_positions=skipped, use_cache=True, **settings)
    expected = shorter.generate(PROMPT, use_cache=True, **settings)
    assert torch.equal(generated.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(generated.logits), torch.stack(expected.logits), rtol=0, atol=0)
    # A KV-cache entry per computed position, none for a skipped one.
    filled = [layer for layer in generated.past_key_values.layers if layer.keys is not None and layer.keys.numel() > 0]
    assert len(filled) == len(active)


@CAUSAL_KINDS
def test_the_config_s_skipped_positions_are_saved_reloaded_and_exported_as_the_shorter_model(kind, tmp_path):
    model = kind.tied_model([0, 1, 1, 1], seed=4)
    model.config.skipped_positions = [3, 2]
    assert model.config.skipped_positions == [2, 3] and model.active_positions() == [0, 1]
    with torch.no_grad():
        expected = shorter_model(kind, model, [0, 1])(PROMPT).logits
        torch.testing.assert_close(model(PROMPT).logits, expected, rtol=0, atol=0)
        full = model(PROMPT, skipped_positions=[]).logits  # [] computes every position
        assert not torch.equal(full, expected)
    model.save_pretrained(tmp_path / "tied")
    reloaded = kind.tied_class.from_pretrained(tmp_path / "tied").eval()
    assert reloaded.config.skipped_positions == [2, 3]
    exported = model.to_untied()
    assert exported.config.num_hidden_layers == 2 and len(exported.get_submodule(kind.blocks_path)) == 2
    with torch.no_grad():
        torch.testing.assert_close(reloaded(PROMPT).logits, expected, rtol=0, atol=0)
        torch.testing.assert_close(exported.eval()(PROMPT).logits, expected, rtol=0, atol=0)
    assert len(model.get_submodule(kind.blocks_path)) == 4  # the blocks are put back after each call


@pytest.mark.parametrize(
    "skipped, message",
    [
        ([4], r"skipped_positions\[0\] = 4 is not a position of this 4-block model \(0 to 3\)"),
        ([0, 1, 2, 3], r"skips every one of the 4 positions: at least one must compute"),
        ([1, 1], r"names a position twice"),
        (["1"], r"skipped_positions\[0\] must be a block position"),
    ],
)
def test_bad_skipped_positions_are_refused_naming_the_entry(skipped, message):
    model = GPT2.tied_model([0, 1, 2, 3])
    with pytest.raises(ValueError, match=message):
        model(PROMPT, skipped_positions=skipped)
    with pytest.raises(ValueError, match=message):
        model.config.skipped_positions = skipped


def test_a_looped_model_runs_fewer_loops_by_skipping_its_last_ones():
    """`cycle:2` over 6 blocks is 3 loops of 2 blocks; skipping positions 4 and 5 runs 2 loops, as a `cycle:2`
    model of 4 blocks with the same 2 weight sets computes."""
    model = GPT2.tied_model([0, 1, 0, 1, 0, 1], seed=5)
    two_loops = GPT2.tied_model([0, 1, 0, 1], seed=9)
    two_loops.load_state_dict({name: tensor for name, tensor in model.state_dict().items() if not any(f".h.{p}." in name for p in (4, 5))}, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(model(PROMPT, skipped_positions=[4, 5]).logits, two_loops(PROMPT).logits, rtol=0, atol=0)


class BlockCalls:
    """The input hidden states, the call's arguments and the output of one block, as a forward hook sees them."""

    def __init__(self, block):
        self.handle = block.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        self.args, self.kwargs, self.output = args, kwargs, output


def hidden_states_and_block_calls(kind, model) -> tuple[tuple, list[BlockCalls]]:
    """A forward pass of `model` on the prompt without a cache: the hidden states before each position (and after
    the last), and what each block was called with."""
    calls = [BlockCalls(block) for block in model.get_submodule(kind.blocks_path)]
    with torch.no_grad():
        hidden = model(PROMPT, output_hidden_states=True, use_cache=False).hidden_states
    return hidden, calls


@pytest.mark.parametrize("kind", [GPT2, LLAMA], ids=lambda kind: kind.name)
def test_the_residual_scale_divides_each_update_by_the_positions_sharing_the_block(kind):
    """`0 1 1 1` with `loop_residual_scale`: block 1 at positions 1-3 adds a third of its update, block 0 all of it."""
    model = kind.tied_model([0, 1, 1, 1], seed=6, loop_residual_scale=True)
    hidden, calls = hidden_states_and_block_calls(kind, model)
    with torch.no_grad():
        for position, share in zip(range(3), (1, 3, 3)):  # the last position's output is normed after it
            call = calls[position]
            unscaled = model.get_submodule(kind.blocks_path)[position](*call.args, **call.kwargs)  # outside the forward: no hook
            unscaled = unscaled[0] if isinstance(unscaled, tuple) else unscaled
            torch.testing.assert_close(hidden[position + 1], hidden[position] + (unscaled - hidden[position]) / share)
        plain = kind.tied_model([0, 1, 1, 1], seed=6)
        assert not torch.equal(plain(PROMPT).logits, model(PROMPT).logits)


@pytest.mark.parametrize("kind", [GPT2, LLAMA], ids=lambda kind: kind.name)
def test_input_injection_adds_the_token_embeddings_to_each_repeated_position(kind):
    model = kind.tied_model([0, 1, 0, 1], seed=7, loop_input_injection=True)
    hidden, calls = hidden_states_and_block_calls(kind, model)
    with torch.no_grad():
        embeddings = model.get_input_embeddings()(PROMPT)
        for position, repeated in enumerate((False, False, True, True)):
            expected = hidden[position] + embeddings if repeated else hidden[position]
            torch.testing.assert_close(calls[position].args[0], expected)
        generated = model.generate(PROMPT, max_new_tokens=4, do_sample=False, pad_token_id=0, use_cache=True)
        uncached = model.generate(PROMPT, max_new_tokens=4, do_sample=False, pad_token_id=0, use_cache=False)
        assert torch.equal(generated, uncached)  # the injection follows the cache: each step's own embeddings


def test_a_model_with_the_loop_recipe_is_not_exported_to_a_plain_class():
    model = GPT2.tied_model([0, 1, 1, 1], loop_residual_scale=True)
    with pytest.raises(ValueError, match=r"to_untied\(\): this model computes with loop_residual_scale, which no plain transformers class computes"):
        model.to_untied()
