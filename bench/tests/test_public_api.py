"""bench calls the package through its public API only: what a user's script could import, so that a change inside
the package (a module moved, a helper renamed) cannot break a study without breaking a documented name."""

import ast
import importlib
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]


def package_imports() -> list[tuple[str, int, str, list[str]]]:
    """(file, line, module, names) of every `from hf_layertie... import ...` in bench's code and tests."""
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hf_layertie":
                found.append((str(path.relative_to(BENCH.parent)), node.lineno, node.module, [alias.name for alias in node.names]))
            elif isinstance(node, ast.Import) and any(alias.name.startswith("hf_layertie.") for alias in node.names):
                found.append((str(path.relative_to(BENCH.parent)), node.lineno, node.names[0].name, ["*"]))
    return found


def public_problem(module_name: str, names: list[str]) -> str | None:
    """Why `from module_name import names` reaches below the public API, or None: a module inside a subpackage
    (`hf_layertie.toolkit.models`: import from `hf_layertie.toolkit`), a private module, or a name its module does
    not export (`__all__`)."""
    parts = module_name.split(".")
    if any(part.startswith("_") for part in parts):
        return "a private module"
    parent = importlib.import_module(".".join(parts[:-1])) if len(parts) > 2 else None
    if parent is not None and hasattr(parent, "__path__"):
        return f"a module inside the subpackage {parent.__name__}: import from {parent.__name__}"
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    hidden = [name for name in names if name == "*" or name.startswith("_") or (exported is not None and name not in exported)]
    return f"not exported by {module_name} ({', '.join(hidden)})" if hidden else None


def test_bench_imports_only_what_the_package_exports():
    imports = package_imports()
    assert len(imports) > 20  # the scan sees bench's imports (they are many)
    problems = [
        f"{path}:{line}: from {module} import {', '.join(names)}: {problem}"
        for path, line, module, names in imports
        if (problem := public_problem(module, names)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_the_check_names_what_reaches_below_the_api():
    assert "subpackage hf_layertie.toolkit" in public_problem("hf_layertie.toolkit.models", ["load_model"])
    assert public_problem("hf_layertie._private", ["x"]) == "a private module"
    assert "not exported" in public_problem("hf_layertie.trainer", ["NonFiniteLossGuard"])
    assert public_problem("hf_layertie.toolkit", ["load_model"]) is None
    assert public_problem("hf_layertie.sharding", ["shard_tied_model"]) is None
