"""bench/loop_depth.py, the loop study's inference depth (issue 76, item 4): the registered rule picks the row, a loop
is what each layout's map repeats, fewer loops are the shorter model, more loops share the trained blocks, and the
report is what its records give."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # `bench` is a folder of the repository, not part of the installed package

from bench import loop_depth  # noqa: E402
from bench.loop_depth import LoopSegment, at_loops, choose_row, looped_rows, recipe_notes, study_records  # noqa: E402
from bench.loop_study import read_preregistration, task_rows  # noqa: E402
from bench.settings import RunSpec  # noqa: E402
from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, resolve_tying_map  # noqa: E402

REGISTRATION = read_preregistration()
# Relaxed ties on looped maps: every position's adapter on shared weights, as the recipe trains them.
pytestmark = pytest.mark.filterwarnings("ignore:PEFT adapters were added to blocks")


def _write_records(folder: Path, task: str, means: dict[str, list[float]], key: str) -> None:
    """Hand-made study records: for each row label, one record per value, seeds 100, 101, ... (the row's own run folder)."""
    rows = {row.label: row for row in task_rows(REGISTRATION, task)}
    for label, values in means.items():
        row = rows[label]
        for seed, value in zip(REGISTRATION["seeds"], values):
            spec = RunSpec(row.label, row.strategy, seed, num_blocks=row.num_blocks, tying=row.tying, looped_config=row.looped_config)
            path = folder / spec.directory / "result.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"label": label, "strategy": row.strategy, "seed": seed, key: value, "test_loss": 9.0}))


def test_the_row_is_the_looped_row_of_best_mean_validation_score_over_the_seeds_it_has_finished(tmp_path):
    language = tmp_path / "language"
    _write_records(language, "language", {
        "untied, 4 blocks": [3.0, 3.0],  # lowest of all, but a baseline
        "dlt + recipe": [3.1],  # a learned map: no registered loop
        "0 1 1 3 4": [4.3, 4.1, 4.2],  # mean 4.2 over three seeds
        "0 1 2 1 2 5 + recipe": [4.15],  # one seed finished: its mean is that seed's
        "cycle:4, 12 positions": [4.0, math.nan],  # a diverged seed: never chosen
    }, "validation_loss")  # fmt: skip
    choice = choose_row(study_records(language, "language"), "language", language)
    assert (choice["label"], choice["seeds"], choice["mean"]) == ("0 1 2 1 2 5 + recipe", [100], 4.15)
    assert choice["metric"] == "validation_loss"
    assert [candidate["label"] for candidate in choice["candidates"]] == ["0 1 1 3 4", "cycle:4, 12 positions", "0 1 2 1 2 5 + recipe"]
    assert choice["candidates"][0]["seeds"] == [100, 101, 102] and choice["candidates"][0]["mean"] == pytest.approx(4.2)
    hop = tmp_path / "hop"
    _write_records(hop, "k-hop", {"untied, 2 blocks": [1.0], "0 1 1 1": [0.9, 0.5], "cycle:2, 4 positions + recipe": [0.8], "0 1 1 1 + rate": [0.8]}, "validation_mean_accuracy")
    choice = choose_row(study_records(hop, "k-hop"), "k-hop", hop)  # highest accuracy; of equals the row trained first
    assert (choice["label"], choice["metric"]) == ("cycle:2, 4 positions + recipe", "validation_mean_accuracy")
    assert not any(row.label.startswith(("untied", "dlt")) for row in looped_rows("language"))
    with pytest.raises(SystemExit, match=f"{tmp_path / 'none'}: no finished record of a looped row of task 'k-hop'"):
        choose_row(study_records(tmp_path / "none", "k-hop"), "k-hop", tmp_path / "none")
    _write_records(tmp_path / "other", "k-hop", {"0 1 1 1": [0.9]}, "validation_loss")  # a record without the metric read
    with pytest.raises(ValueError, match="no 'validation_mean_accuracy'"):
        choose_row(study_records(tmp_path / "other", "k-hop"), "k-hop", tmp_path / "other")


@pytest.mark.parametrize(
    ("layout", "positions", "start", "width", "loops", "one_loop"),
    [
        ("cycle:4", 12, 0, 4, 3, [0, 1, 2, 3]),  # the whole stack loops: one loop is the first U positions
        ("0,1,1,3,4", 5, 1, 1, 2, [0, 1, 2, 3]),  # position 1's block, twice: one loop is the untied 4 blocks
        ("0,1,2,1,2,5", 6, 1, 2, 2, [0, 1, 2, 3]),
        ("0,1,1,1", 4, 1, 1, 3, [0, 1]),
        ("cycle:2", 4, 0, 2, 2, [0, 1]),
    ],
)
def test_one_loop_is_one_pass_over_the_looped_segment_of_every_registered_layout(layout, positions, start, width, loops, one_loop):
    tying_map = resolve_tying_map(layout, positions).to_list()
    segment = LoopSegment.of(tying_map)
    assert (segment.start, segment.width, segment.loops) == (start, width, loops)
    assert segment.map_at(loops) == tying_map and segment.map_at(1) == one_loop
    assert segment.skipped_at(loops) == [] and len(tying_map) - len(segment.skipped_at(1)) == len(one_loop)
    longer = segment.map_at(loops + 1)
    assert len(longer) == positions + width and LoopSegment.of(longer).loops == loops + 1
    assert layout in {layout for plan in REGISTRATION["tasks"].values() for layout in plan["layouts"]}  # each registered one


def test_a_map_without_one_looped_segment_is_refused():
    for tying_map in ([0, 1, 2, 3], [0, 0, 2, 2], [0, 1, 0, 3, 1]):
        with pytest.raises(ValueError, match="looped segment"):
            LoopSegment.of(tying_map)


def _tiny_looped_model(tmp_path: Path, layout: str, positions: int) -> TiedGPT2LMHeadModel:
    """A tiny TiedGPT2 under the whole recipe (residual scaling, input injection, rank-1 adapters per position, their
    updates made non-zero, so that each position's adapter counts), saved and loaded back as the analysis loads it."""
    from hf_layertie.relaxed_ties import relax_ties

    torch.manual_seed(0)
    config = TiedGPT2Config(
        vocab_size=40, n_embd=16, n_head=2, n_layer=positions, n_positions=16, tying_map=resolve_tying_map(layout, positions).to_list(),
        loop_residual_scale=True, loop_input_injection=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = TiedGPT2LMHeadModel(config)
    relax_ties(model, 1, "zero")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    model.save_pretrained(tmp_path / layout.replace(":", "-"))
    return TiedGPT2LMHeadModel.from_pretrained(tmp_path / layout.replace(":", "-")).eval()


@pytest.mark.parametrize(("layout", "positions"), [("0,1,2,1,2,5", 6), ("cycle:2", 6)])
def test_skipping_a_loop_is_the_shorter_model_and_the_trained_depth_is_the_model(tmp_path, layout, positions):
    model = _tiny_looped_model(tmp_path, layout, positions)
    segment = LoopSegment.of(model.tying_map.to_list())
    ids = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        assert torch.equal(at_loops(model, segment, segment.loops)(ids).logits, full)
        for loops in range(1, segment.loops):
            skipping = model(ids, skipped_positions=segment.skipped_at(loops)).logits
            shorter = at_loops(model, segment, loops)
            assert shorter.tying_map.to_list() == segment.map_at(loops)
            torch.testing.assert_close(shorter(ids).logits, skipping, rtol=0, atol=1e-6)
            assert not torch.allclose(skipping, full)  # a loop less computes something else
    assert recipe_notes(model, segment, segment.loops) == []
    assert [note.split(":")[0] for note in recipe_notes(model, segment, 1)] == ["residual scaling", "per-position adapters"]


@pytest.mark.parametrize(("layout", "positions"), [("0,1,2,1,2,5", 6), ("cycle:2", 4)])
def test_a_model_with_loops_added_shares_the_trained_blocks_and_keeps_every_trained_position(tmp_path, layout, positions):
    model = _tiny_looped_model(tmp_path, layout, positions)
    segment = LoopSegment.of(model.tying_map.to_list())
    longer = at_loops(model, segment, segment.loops + 1)
    assert longer.tying_map.to_list() == segment.map_at(segment.loops + 1)
    blocks, trained = longer.tied_blocks, model.tied_blocks
    for position, (weights, stands_for) in enumerate(segment.roles(segment.loops + 1)):
        root = longer.tying_map[position]
        for (name, parameter), (_, shared) in zip(blocks[position].named_parameters(), blocks[root].named_parameters()):
            if "lora_" not in name:
                assert parameter is shared, (position, name)  # tied: the same Parameter as its group's first position
                assert torch.equal(parameter, dict(trained[weights].named_parameters())[name])  # the trained weights
            elif stands_for is not None:  # a trained position keeps its adapter
                assert torch.equal(parameter, dict(trained[stands_for].named_parameters())[name])
            elif "lora_B" in name:  # an added position: no adapter update, the shared weights alone
                assert not parameter.any()
    base = {id(p) for name, p in longer.named_parameters() if "lora_" not in name}
    assert len(base) == len({id(p) for name, p in model.named_parameters() if "lora_" not in name})  # no block stored twice
    notes = recipe_notes(model, segment, segment.loops + 1)
    assert [note.split(":")[0] for note in notes] == ["residual scaling", "per-position adapters", "input injection"]
    if segment.start == 0:  # `cycle:U`: the added positions follow every trained one, where a longer map loads as well
        folder = tmp_path / layout.replace(":", "-")
        loaded = TiedGPT2LMHeadModel.from_pretrained(folder, tying_map=longer.tying_map.to_list(), num_hidden_layers=len(longer.tying_map))
        ids = torch.randint(0, 40, (2, 12))
        with torch.no_grad():
            torch.testing.assert_close(loaded.eval()(ids).logits, longer(ids).logits, rtol=0, atol=1e-6)


@pytest.mark.e2e
def test_the_command_end_to_end_at_tiny_sizes_resumes_and_its_report_rebuilds_from_its_records(tmp_path, monkeypatch):
    from bench import measure

    study, output = tmp_path / "study", tmp_path / "depth"
    _write_records(study, "language", {"0 1 2 1 2 5 + recipe": [4.1, 4.2], "0 1 1 3 4": [4.3]}, "validation_loss")
    flags = ["--task", "language", "--study_results", str(study), "--results_dir", str(output), "--smoke", "true", "--rounds", "2", "--extra_loops", "1"]
    monkeypatch.setattr(sys, "argv", ["bench/loop_depth.py", *flags])
    loop_depth.main()
    settings = json.loads((output / "settings.json").read_text())
    assert settings["choice"]["label"] == "0 1 2 1 2 5 + recipe" and settings["choice"]["seeds"] == [100, 101]
    spec = RunSpec.from_json(json.dumps(settings["spec"]))
    assert spec.seed == min(REGISTRATION["seeds"]) and spec.label == "0 1 2 1 2 5 + recipe"
    run = json.loads((output / spec.directory / "result.json").read_text())
    assert (output / spec.directory / "model" / "config.json").is_file()  # the weights kept
    depths = {loops: json.loads((output / "depths" / f"loops-{loops}" / "result.json").read_text()) for loops in (1, 2, 3)}
    assert depths[2]["test_loss"] == pytest.approx(run["test_loss"], rel=1e-6)  # the trained depth scores as the run did
    assert [depths[loops]["block_calls_per_token"] for loops in (1, 2, 3)] == [4, 6, 8]
    assert [depths[loops]["how"] for loops in (1, 2, 3)] == ["skipped positions", "as trained", "positions added"]
    assert depths[1]["skipped_positions"] == [3, 4] and depths[3]["map"] == [0, 1, 2, 1, 2, 1, 2, 7]
    timing = json.loads((output / "timing" / "result.json").read_text())
    assert set(timing["depths"]) == {"1", "2", "3"} and all(len(d["seconds_by_round"]) == 2 for d in timing["depths"].values())
    report = (output / "inference-depth-language.md").read_text()
    assert "| 2 | as trained | 6 |" in report and "at tiny sizes (`--smoke true`)" in report
    # Resumed: every piece is read back, nothing trained, scored or timed again; the report is the same.
    monkeypatch.setattr(measure, "run", lambda *args, **kwargs: pytest.fail("trained again"))
    monkeypatch.setattr(loop_depth, "score", lambda *args, **kwargs: pytest.fail("scored again"))
    monkeypatch.setattr(loop_depth, "time_depths", lambda *args, **kwargs: pytest.fail("timed again"))
    loop_depth.main()
    assert (output / "inference-depth-language.md").read_text() == report
    # The report rebuilds from the records alone, elsewhere.
    monkeypatch.setattr(sys, "argv", ["bench/loop_depth.py", *flags, "--report_only", "true", "--report_dir", str(tmp_path / "again")])
    loop_depth.main()
    for suffix in ("md", "json"):
        assert (tmp_path / "again" / f"inference-depth-language.{suffix}").read_text() == (output / f"inference-depth-language.{suffix}").read_text()
    # Records that now choose another row: the folder is refused, not mixed.
    _write_records(study, "language", {"0 1 1 3 4": [3.0]}, "validation_loss")
    monkeypatch.setattr(sys, "argv", ["bench/loop_depth.py", *flags])
    with pytest.raises(SystemExit, match="holds records of another analysis .*now '0 1 1 3 4'"):
        loop_depth.main()


@pytest.mark.e2e
def test_on_k_hop_each_depth_is_scored_by_mean_accuracy_and_the_trained_depth_as_the_run_scored_it(tmp_path, monkeypatch):
    study, output = tmp_path / "study", tmp_path / "depth"
    _write_records(study, "k-hop", {"0 1 1 1 + recipe": [0.9], "cycle:2, 4 positions": [0.5]}, "validation_mean_accuracy")
    flags = ["--task", "hop", "--study_results", str(study), "--results_dir", str(output), "--smoke", "true", "--rounds", "1", "--extra_loops", "1"]
    monkeypatch.setattr(sys, "argv", ["bench/loop_depth.py", *flags])
    loop_depth.main()
    spec = RunSpec.from_json(json.dumps(json.loads((output / "settings.json").read_text())["spec"]))
    run = json.loads((output / spec.directory / "result.json").read_text())
    depths = {loops: json.loads((output / "depths" / f"loops-{loops}" / "result.json").read_text()) for loops in (1, 2, 3, 4)}
    assert depths[3]["mean_accuracy"] == run["mean_accuracy"] and depths[3]["accuracy_by_hops"] == run["accuracy_by_hops"]
    assert [depths[loops]["block_calls_per_token"] for loops in (1, 2, 3, 4)] == [2, 3, 4, 5]
    assert depths[2]["skipped_positions"] == [3] and depths[4]["map"] == [0, 1, 1, 1, 1]
    report, trained = (output / "inference-depth-hop.md").read_text(), depths[3]
    by_hops = " | ".join(f"{trained['accuracy_by_hops'][hop]:.3f}" for hop in ("1", "2"))
    assert "| 1 hop | 2 hops | ms per token |" in report  # which lookups each depth still does, per hop count
    assert f"| 3 | as trained | 4 | {trained['mean_accuracy']:.3f} | {by_hops} | " in report


def test_bad_flags_are_named():
    from bench.loop_depth import LoopDepthArguments

    with pytest.raises(ValueError, match="--task 'k-hop': expected one of hop, language"):
        LoopDepthArguments(task="k-hop")
    with pytest.raises(ValueError, match="--smoke true .* --results_dir"):
        LoopDepthArguments(task="hop", smoke=True)
    with pytest.raises(ValueError, match="--extra_loops must be 1 or 2"):
        LoopDepthArguments(task="hop", extra_loops=3)
