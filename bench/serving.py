#!/usr/bin/env python
"""A tied model served by llama.cpp: the looped format (each distinct block stored once) beside the plain export.

    python bench/serving.py                 # about 15 minutes on one core: trains the model first if its run is absent
    python bench/serving.py --report_only   # bench/reports/serving/results.{json,md} from the record

The model: `python run_clm.py --model_type tied_llama --tying_strategy static:cycle:2 --tokenizer_name gpt2 --seed 0
--max_steps 600 --serving_output_dir ...`, the embedded default (6 positions x 96 on the shipped plays) as a Llama
whose 6 positions loop over 2 blocks, with GPT-2's tokenizer (one llama.cpp's converter recognises), trained into
`bench/results/serving/run/` (resumed where a sitting stopped).
Its looped export (`save_for_serving`, written by the run) and its plain export (`to_untied()`) are each converted by
llama.cpp's own converter (`convert_hf_to_gguf.py` of the installed llama-cpp-python's source distribution, fetched
from the package index once) to an f32 GGUF, then quantised by llama.cpp to Q8_0 and Q4_K_M. Every GGUF is scored
through llama.cpp (llama-cpp-python, f32 KV cache, one thread) on the first `--eval_blocks` 64-token blocks of the
held-out play: the mean next-token loss, and the largest logit difference from the tied model (transformers) on
the same blocks. The record is `bench/results/serving/result.json`; the report's table is generated from it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.markdown_tables import refresh_markdown  # noqa: E402
from bench.provenance import provenance  # noqa: E402
from bench.scheduling import RESULT_FILE, write_whole  # noqa: E402
from bench.settings import REPO_ROOT  # noqa: E402
from hf_layertie import TiedLlamaForCausalLM  # noqa: E402
from hf_layertie.language_modeling import CAUSAL_LM, run  # noqa: E402
from hf_layertie.toolkit import load_text_datasets, text_column, tokenize_and_group  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "serving"
REPORT = REPO_ROOT / "bench" / "reports" / "serving"
CONVERTER_CACHE = Path.home() / ".cache" / "hf-layertie"
# The run: the embedded default as a looped Llama (what docs/serving.md trains too, shorter).
# GPT-2's tokenizer: llama.cpp's converter recognises a BPE tokenizer by a hash of its output on a test text, so only
# published ones convert (the shipped shakespeare-bpe does not).
# 600 steps: GPT-2's 50,257-token output layer makes a step about 15 times the default's on one thread.
TRAINING_FLAGS = (
    "--model_type", "tied_llama", "--tying_strategy", "static:cycle:2", "--tokenizer_name", "gpt2", "--max_steps", "600",
    "--save_steps", "200", "--seed", "0", "--report_to", "none",
)  # fmt: skip
# llama.cpp's file types (`llama_ftype`) of the quantised GGUFs.
QUANTISATIONS = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}
BLOCK_SIZE = 64


def llama_cpp_converter(cache: Path = CONVERTER_CACHE) -> Path:
    """`convert_hf_to_gguf.py` of the installed llama-cpp-python's own llama.cpp (its source distribution vendors it
    with the gguf-py it needs; PyPI's `gguf` lacks the looped architecture), fetched from the package index and
    unpacked once into `cache`."""
    version = metadata.version("llama-cpp-python")
    root = cache / f"llama-cpp-python-{version}"
    script = root / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if script.is_file():
        return script
    with tempfile.TemporaryDirectory() as download:
        command = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-binary", ":all:", "--no-deps", "-d", download]
        subprocess.run(command, check=True, capture_output=True, text=True)
        (archive,) = Path(download).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(archive) as source:
            prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
            wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")
            members = [member for member in source.getmembers() if member.name.startswith(tuple(prefix + name for name in wanted))]
            source.extractall(cache / "unpacking", members=members, filter="data")
    (cache / "unpacking" / f"llama_cpp_python-{version}").rename(root)
    return script


def convert_to_gguf(folder: Path, outfile: Path) -> Path:
    """`folder` (a transformers checkpoint or a looped export) as an f32 GGUF, by llama.cpp's converter."""
    command = [sys.executable, str(llama_cpp_converter()), str(folder), "--outtype", "f32", "--outfile", str(outfile)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {folder}:\n{done.stderr[-3000:]}")
    return outfile


def quantise(gguf: Path, outfile: Path, kind: str) -> Path:
    """`gguf` quantised by llama.cpp (`llama_model_quantize`) to `kind`, a key of `QUANTISATIONS`."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANTISATIONS[kind])
    if llama_cpp.llama_model_quantize(str(gguf).encode(), str(outfile).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantise {gguf} to {kind}")
    return outfile


def gguf_tensors(gguf: Path) -> list:
    """A GGUF's tensors, read by the converter's own gguf-py (the one that knows the looped architecture)."""
    sys.path.insert(0, str(llama_cpp_converter().parent / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    return list(GGUFReader(gguf).tensors)


def gguf_tensor_types(gguf: Path) -> dict[str, int]:
    """How many of a GGUF's tensors hold each type (llama.cpp's K-quants fall back to other types for tensors whose
    rows are not a multiple of 256 values: at width 96, Q4_K_M stores Q5_0 and Q8_0)."""
    types: dict[str, int] = {}
    for tensor in gguf_tensors(gguf):
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    return dict(sorted(types.items()))


def gguf_logits(gguf: Path, blocks: list[list[int]]) -> list[np.ndarray]:
    """llama.cpp's logits at every position of each block (f32 KV cache, which keeps them within float32 rounding of
    transformers'; the default f16 cache moves them by about 1e-3), one block at a time from an empty cache."""
    import llama_cpp

    context = max(len(block) for block in blocks)
    model = llama_cpp.Llama(
        model_path=str(gguf), n_ctx=context, n_batch=context, logits_all=True, n_threads=1, verbose=False,
        type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
    )  # fmt: skip
    logits = []
    for block in blocks:
        model.reset()
        model.eval(block)
        logits.append(np.array(model.scores[: len(block)], dtype=np.float64))
    model.close()
    return logits


def next_token_loss(logits: list[np.ndarray], blocks: list[list[int]]) -> float:
    """The mean next-token cross-entropy (nats) of `logits` on `blocks`: each block's L - 1 predictions."""
    total, count = 0.0, 0
    for scores, block in zip(logits, blocks):
        shifted = scores[:-1] - scores[:-1].max(axis=1, keepdims=True)
        log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        total -= log_probabilities[np.arange(len(block) - 1), block[1:]].sum()
        count += len(block) - 1
    return total / count


def held_out_blocks(tokenizer, count: int) -> list[list[int]]:
    """The first `count` 64-token blocks of the embedded corpus's held-out play, as the run evaluated them."""
    raw = load_text_datasets()
    grouped = tokenize_and_group(raw, tokenizer, text_column(raw, None), BLOCK_SIZE)
    validation = grouped["validation"]
    if count > len(validation):
        raise ValueError(f"--eval_blocks {count}: the held-out play has {len(validation)} blocks of {BLOCK_SIZE} tokens")
    return [list(row["input_ids"]) for row in validation.select(range(count))]


def measure(eval_blocks: int) -> dict:
    run_dir, serving_dir = RESULTS / "run", RESULTS / "looped"
    source = provenance()
    run(CAUSAL_LM, [*TRAINING_FLAGS, "--output_dir", str(run_dir), "--serving_output_dir", str(serving_dir)])
    tied = TiedLlamaForCausalLM.from_pretrained(run_dir).eval()
    untied_dir = RESULTS / "untied"
    tied.to_untied().save_pretrained(untied_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (untied_dir / name).write_bytes((serving_dir / name).read_bytes())
    from transformers import AutoTokenizer

    blocks = held_out_blocks(AutoTokenizer.from_pretrained(run_dir), eval_blocks)
    with torch.no_grad():
        reference = [tied(torch.tensor([block])).logits[0].double().numpy() for block in blocks]
    reference_loss = next_token_loss(reference, blocks)
    rows = {}
    for export, folder, stored in (("looped", serving_dir, tied.tying_map.num_distinct), ("untied", untied_dir, len(tied.tying_map))):
        f32 = convert_to_gguf(folder, RESULTS / f"{export}-f32.gguf")
        for kind, gguf in (("f32", f32), *((kind, quantise(f32, RESULTS / f"{export}-{kind}.gguf", kind)) for kind in QUANTISATIONS)):
            logits = gguf_logits(gguf, blocks)
            loss = next_token_loss(logits, blocks)
            rows[f"{export}, {kind}"] = {
                "loss": loss,
                "loss_increase": loss - reference_loss,
                "largest_logit_difference": max(float(np.abs(ours - theirs).max()) for ours, theirs in zip(logits, reference)),
                "file_mib": gguf.stat().st_size / 2**20,
                "tensor_types": gguf_tensor_types(gguf),
                "stored_blocks": stored,
            }
    return {
        "model": f"tied Llama, map {tied.tying_map.render()}, width {tied.config.hidden_size}, vocabulary {tied.config.vocab_size}",
        "training": "python run_clm.py " + " ".join(TRAINING_FLAGS),
        "reference": {"loss": reference_loss, "tied_checkpoint_mib": (run_dir / "model.safetensors").stat().st_size / 2**20},
        "eval_blocks": len(blocks),
        "block_size": BLOCK_SIZE,
        "llama_cpp_python": metadata.version("llama-cpp-python"),
        **source,  # commit, python, versions, hardware
        "rows": rows,
    }


def markdown(record: dict) -> str:
    lines = [
        f"{record['model']}, trained by `{record['training']}`, served by llama.cpp (llama-cpp-python "
        f"{record['llama_cpp_python']}, f32 KV cache) from its looped export (`save_for_serving`) and its plain "
        f"export (`to_untied()`), each converted by llama.cpp's converter to f32 and quantised by llama.cpp. Loss: "
        f"mean next-token loss (nats) on the first {record['eval_blocks']} {record['block_size']}-token blocks of the "
        f"held-out play, and its increase over the tied model's in transformers ({record['reference']['loss']:.4f}; "
        f"its checkpoint {record['reference']['tied_checkpoint_mib']:.2f} MiB); logit difference: the largest from "
        f"the tied model's on those blocks. `python bench/serving.py`; commit {record['commit']}. Hardware: {record['hardware']}.",
        "",
        "| export, GGUF type | stored blocks | file (MiB) | loss | increase | largest logit difference | tensors by type |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, row in record["rows"].items():
        types = ", ".join(f"{name} {count}" for name, count in row["tensor_types"].items())
        lines.append(
            f"| {label} | {row['stored_blocks']} | {row['file_mib']:.2f} | {row['loss']:.4f} | {row['loss_increase']:+.4f} | "
            f"{row['largest_logit_difference']:.1e} | {types} |"
        )
    return "\n".join(lines) + "\n"


def write_report(record: dict, folder: Path = REPORT) -> None:
    """The report from the record; into bench/reports/serving/, the Markdown tables that read it follow."""
    folder.mkdir(parents=True, exist_ok=True)
    write_whole(folder / "results.json", json.dumps(record, indent=1) + "\n")
    write_whole(folder / "results.md", markdown(record))
    if folder == REPORT:
        refresh_markdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval_blocks", type=int, default=200, help="Held-out blocks scored through llama.cpp.")
    parser.add_argument("--report_only", action="store_true", help="Rebuild the report from the record.")
    parser.add_argument("--report_dir", type=Path, default=REPORT, help="Where results.{json,md} go.")
    arguments = parser.parse_args()
    if arguments.eval_blocks < 1:
        parser.error(f"--eval_blocks must be >= 1, got {arguments.eval_blocks}")
    record_path = RESULTS / RESULT_FILE
    if not arguments.report_only:
        record = measure(arguments.eval_blocks)
        if not all(math.isfinite(row["loss"]) for row in record["rows"].values()):  # a broken GGUF, not a result
            raise RuntimeError(f"a loss is not finite: {record['rows']}")
        RESULTS.mkdir(parents=True, exist_ok=True)
        write_whole(record_path, json.dumps(record, indent=1) + "\n")
    write_report(json.loads(record_path.read_text()), arguments.report_dir)
    print(markdown(json.loads(record_path.read_text())))


if __name__ == "__main__":
    main()
