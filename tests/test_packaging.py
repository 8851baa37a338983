"""What the wheel carries: every file the package reads at run time, and one version.

CI builds the wheel and runs ``transduce demo`` from it (``.ci/run``); this is the quick check,
without a build: every non-Python file under ``src/transduce`` (a demo's config, the server's page)
is matched by ``[tool.setuptools.package-data]``, which is what puts it in the wheel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import transduce

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "transduce"


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    if not (ROOT / "pyproject.toml").is_file() or not PACKAGE.is_dir():
        pytest.skip("not run from a source tree")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_data_file_is_package_data():
    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["transduce"]
    data = {p for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert data, "no data files found: has the layout changed?"
    packaged = {p for pattern in patterns for p in PACKAGE.glob(pattern)}  # setuptools' reading of them
    missing = sorted(p.relative_to(PACKAGE).as_posix() for p in data - packaged)
    assert not missing, f"not in [tool.setuptools.package-data] (so not in the wheel): {missing}"


def test_the_version_is_written_once():
    pyproject = _pyproject()
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "transduce.__version__" and transduce.__version__.count(".") == 2
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{transduce.__version__}]" in changelog, "CHANGELOG.md has no entry for this version"
