"""Source for fresh interpreters that load checkpoints "without the package": importing hf_layertie raises there, so
a checkpoint can only have used the remote code stored next to it (used by the compatibility and Hub tests)."""

REFUSE_HF_LAYERTIE = """
import sys

class RefuseHfLayertie:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hf_layertie":
            raise ImportError(f"{name} must not be needed to load a saved checkpoint")

sys.meta_path.insert(0, RefuseHfLayertie())
"""
