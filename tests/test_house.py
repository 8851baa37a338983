"""The house keeps its shape (issue 29): no function in src/ or bench/ over 60 lines, no module
over 450 lines except data tables. A data-table module holds data only (no function or class),
so code cannot hide in one. Imports of the package's own modules sit at the top of a module
(issue 53), all in one place; one inside a function says why on its line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import transduce

ROOT = Path(transduce.__file__).parent
BENCH = Path(__file__).resolve().parents[1] / "bench"  # the benchmarks: the same size rules (STYLE)
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450
DATA_TABLES = {"data/toy_tables.py"}  # the toy pair's lexicon and morphology
# Why an import of the package's own modules may sit inside a function, said on its line (a multi-line
# import: on the line of its `from`): "# lazy: start-up" (the CLI's --help and argument errors, or a
# torch-free path, stay fast), "# lazy: optional extra", "# lazy: cycle with MODULE", or
# "# lazy: contract NAME" (a layer contract of pyproject.toml's [tool.importlinter] it would break).
LAZY_REASON = re.compile(r"#\s*lazy: (start-up|optional extra|cycle with \S|contract \S)")


def _modules() -> dict[str, str]:
    """Path relative to the package (posix) -> source, for every module of the package."""
    return {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8") for path in sorted(ROOT.rglob("*.py"))}


def _sized_modules() -> dict[str, str]:
    """The package's modules and the benchmarks' (``bench/NAME.py``): what the size rules cover."""
    bench = {f"bench/{path.name}": path.read_text(encoding="utf-8") for path in sorted(BENCH.glob("*.py"))}
    assert bench, f"no benchmarks found in {BENCH}"
    return {**_modules(), **bench}


def _lines(source: str) -> int:
    return len(source.splitlines())


def test_no_function_over_60_lines():
    long = []
    for name, source in _sized_modules().items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_module_over_450_lines_except_data_tables():
    modules = _sized_modules()
    long = [f"{name} ({_lines(source)} lines)" for name, source in modules.items()
            if _lines(source) > MAX_MODULE_LINES and name not in DATA_TABLES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_data_tables_hold_only_data():
    modules = _modules()
    for name in DATA_TABLES:
        assert name in modules, f"{name}: no such module (update DATA_TABLES)"
        code = [node.name for node in ast.walk(ast.parse(modules[name]))
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        assert not code, f"{name} is allowed to be long as a data table, but defines {code}"


def test_test_modules_have_unique_names():
    # the tests import by basename (no packages): two test_x.py in different folders break collection
    from collections import Counter

    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []


def _private_imports(source: str) -> list[str]:
    """``from <transduce module> import _name`` in ``source``: another module's private names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("transduce")):
            found += [f"{node.lineno}: {a.name}" for a in node.names if a.name.startswith("_")
                      and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_names():
    # STYLE rule 29: a private name used across modules is one module split in two, or a public helper
    assert _private_imports("from .ct2 import _set_linear, set_norm\nfrom ..x import __version__") == ["1: _set_linear"]
    found = {name: hits for name, source in _modules().items() if (hits := _private_imports(source))}
    assert not found, f"imports of another module's private names: {found}"


def _unexplained_lazy_imports(source: str) -> list[str]:
    """``LINE: text`` of each import of a transduce module inside a function of ``source`` whose
    line (its first) carries no ``# lazy:`` reason (:data:`LAZY_REASON`)."""
    lines = source.splitlines()
    found = set()
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            ours = (isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("transduce"))
                    or isinstance(node, ast.Import) and any(a.name.split(".")[0] == "transduce" for a in node.names))
            if ours and not LAZY_REASON.search(lines[node.lineno - 1]):
                found.add((node.lineno, lines[node.lineno - 1].strip()))
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_function_local_imports_of_the_package_say_why():
    # issue 53: a module's dependencies at its top, where an import cycle fails at import, not at a first call
    sample = ("import os\nfrom .a import b\ndef f():\n    import json\n    from .x import y\n"
              "    from transduce.z import (w,  # lazy: start-up\n                             v)\n"
              "    def g():\n        import transduce.q\n        from ..r import s  # lazy: cycle with r\n")
    assert _unexplained_lazy_imports(sample) == ["5: from .x import y", "9: import transduce.q"]
    found = {name: hits for name, source in _modules().items()
             if (hits := _unexplained_lazy_imports(source))}
    assert not found, f"imports of the package inside functions, with no '# lazy: REASON' on the line: {found}"
