"""The package's layering: model/ knows nothing of the layers above it, and no two packages
import each other (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

import transduce

ROOT = Path(transduce.__file__).parent
PACKAGES = ("model", "data", "training", "inference", "evaluation", "export", "serve", "viz")


def _unit(path: Path) -> str:
    """The subpackage of a module, or the top-level module's own name (cli, config, ...)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[0] if len(parts) > 1 else parts[0]


def _imports() -> dict[str, set[str]]:
    """unit -> the other units its modules import, anywhere in the module."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        unit = _unit(path)
        module = path.relative_to(ROOT).with_suffix("").parts
        package = module[:-1] if path.name != "__init__.py" else module[:-1]
        targets = graph.setdefault(unit, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[tuple[str, ...]] = []
            if isinstance(node, ast.Import):
                names = [tuple(a.name.split(".")) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = tuple((node.module or "").split(".")) if node.module else ()
                if node.level:
                    anchor = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                    names = [anchor + base] if base else [anchor + (a.name,) for a in node.names]
                else:
                    names = [base]
            for name in names:
                if name and name[0] == "transduce":
                    name = name[1:]
                elif node.__class__ is ast.Import or not getattr(node, "level", 0):
                    continue
                if name and name[0] != unit and ((ROOT / name[0]).is_dir() or (ROOT / f"{name[0]}.py").is_file()):
                    targets.add(name[0])
    return graph


def test_model_imports_nothing_above_it():
    graph = _imports()
    assert not graph["model"] & {"inference", "training", "export", "serve", "data", "evaluation", "viz", "cli"}
    for path in (ROOT / "model").rglob("*.py"):
        assert "inference" not in path.read_text(encoding="utf-8"), path


def test_no_import_cycle_between_packages():
    graph = _imports()
    cycles = []

    def visit(unit: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(unit, ())):
            if nxt in trail:
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif len(trail) < len(graph):
                visit(nxt, trail + [nxt])

    for unit in graph:
        visit(unit, [unit])
    assert not cycles, cycles[:5]


def test_evaluation_knows_nothing_of_training():
    """A run's validation takes BLEU and the held-out loss from evaluation/, never the reverse."""
    assert "training" not in _imports()["evaluation"]
