"""Regenerate `example_tied_gpt2.md` and `tying_map.png`: the card `python run_clm.py` writes for its default run.

    python model_cards/make_example_card.py            # the whole default run, about 3 minutes on 2 CPU cores

Runs the embedded default (`hf_layertie/language_modeling/defaults/clm_default.json`: the shipped Shakespeare
corpus and tokenizer, offline) into a temporary folder and copies the model card and the tying plot here, so
the example is exactly what a user's first run leaves. The numbers in it are whatever this run measures.
"""

import shutil
import tempfile
from pathlib import Path

from hf_layertie.language_modeling import CAUSAL_LM, run

HERE = Path(__file__).resolve().parent


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        output_dir = Path(folder) / "tied-gpt2-shakespeare"  # the default run's folder name: the card's title
        run(CAUSAL_LM, ["--output_dir", str(output_dir), "--report_to", "none"])
        shutil.copyfile(Path(output_dir) / "README.md", HERE / "example_tied_gpt2.md")
        shutil.copyfile(Path(output_dir) / "tying_map.png", HERE / "tying_map.png")


if __name__ == "__main__":
    main()
