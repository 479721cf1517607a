"""The import floors of docs/architecture.md hold in the code.

The floor block in the doc is the single source: each ``mmte`` import (at module level or inside a
function, absolute or relative, or ``importlib.import_module("mmte....")``) must go to the importer's
own unit or to a unit on a lower floor, and every module must belong to a unit on the plan.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mmte"
DOC = ROOT / "docs" / "architecture.md"


def read_plan(text: str) -> tuple[dict[str, int], dict[str, str]]:
    """``({name: floor}, {name: unit})`` from the floor rows of the doc's ```text block under "## The floors";
    ``"model+model_stages"`` makes ``model_stages`` a member of unit ``model``."""
    m = re.search(r"^## The floors\n.*?```text\n(.*?)```", text, re.DOTALL | re.MULTILINE)
    assert m, f"{DOC} has no '## The floors' section with a ```text block"
    floors: dict[str, int] = {}
    units: dict[str, str] = {}
    for line in m.group(1).splitlines():
        row = re.match(r"^\s*(\d+)\s+(.+)$", line)
        if not row:
            continue
        for unit in row.group(2).split():
            names = unit.split("+")
            for name in names:
                assert name not in floors, f"{name!r} stands on two floors of the plan"
                floors[name], units[name] = int(row.group(1)), names[0]
    return floors, units


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every mmte module ``path`` (under ``root``) imports, relative imports resolved."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # "from .. import device" imports the submodule mmte.device; "from . import __version__" a name of mmte
            sub = [f"{mod}.{a.name}" for a in node.names if is_module(f"{mod}.{a.name}", root)]
            out += [(node.lineno, m) for m in sub] or [(node.lineno, mod)]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
    return [(line, m) for line, m in out if m == "mmte" or m.startswith("mmte.")]


def is_module(dotted: str, root: Path = ROOT) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def unit_of(module: str, units: dict[str, str]) -> str | None:
    """The plan's unit of ``mmte.x.y`` (``x``, or the unit ``x`` is part of); None for the package face."""
    parts = module.split(".")
    return None if len(parts) == 1 else units.get(parts[1], parts[1])


FLOORS, UNITS = read_plan(DOC.read_text())
SOURCES = sorted(PKG.rglob("*.py"))


def test_the_plan_reads_as_drawn():
    """The parser sees the doc's picture: a few known places and the unit made of two modules."""
    assert FLOORS["errors"] == 0 and FLOORS["seq"] == 1 and FLOORS["te"] == 2 and FLOORS["data"] == 2
    assert FLOORS["fp8"] == FLOORS["parallel"] == FLOORS["tokenizers"] == 3 and FLOORS["encoders"] == 4
    assert FLOORS["cli"] == 8 and FLOORS["serve"] == 7 and UNITS["model_stages"] == UNITS["model_parts"] == "model" and FLOORS["model_stages"] == 5
    assert [m for _, m in imported_modules(PKG / "tokenizers" / "base.py")] == ["mmte.seq"]
    assert ("mmte.training.data.base", "mmte.data.datasets") in {(module_name(PKG / "training" / "data" / "base.py"), m)
                                                                for _, m in imported_modules(PKG / "training" / "data" / "base.py")}


def test_every_module_has_a_place_on_the_plan():
    """A new module or sub-package of mmte/ is added to the floors in docs/architecture.md."""
    missing = sorted({unit_of(module_name(p), UNITS) for p in SOURCES} - {None} - set(FLOORS))
    assert not missing, f"{missing} are on no floor of docs/architecture.md; add them to its floor block"
    present = {module_name(p).split(".")[1] for p in SOURCES if module_name(p) != "mmte"}
    extra = sorted(set(FLOORS) - present)
    assert not extra, f"the plan names {extra}, which are not in mmte/"


def test_no_import_runs_up_or_sideways():
    """Each mmte import goes to the importer's own unit or to a lower floor."""
    faults = []
    for path in SOURCES:
        me = unit_of(module_name(path), UNITS)
        if me is None:  # mmte/__init__.py: the lazy package face stands above every floor
            continue
        for line, target in imported_modules(path):
            to = unit_of(target, UNITS)
            if to is None:
                if not face_version_only(path, line):
                    faults.append(f"{path.relative_to(ROOT)}:{line} imports from the package face 'mmte'; import the defining module")
            elif to != me and FLOORS[to] >= FLOORS[me]:
                faults.append(
                    f"{path.relative_to(ROOT)}:{line} ({me}, floor {FLOORS[me]}) imports {target} ({to}, floor {FLOORS[to]})"
                )
    assert not faults, "imports against docs/architecture.md:\n" + "\n".join(faults)


def face_version_only(path: Path, line: int) -> bool:
    """Whether the import at ``line`` takes only ``__version__`` from ``mmte/__init__.py`` (defined there, not
    a lazy re-export, and loaded by every import anyway)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.lineno == line:
            return [a.name for a in node.names] == ["__version__"]
    return False


def test_the_check_sees_a_fault(tmp_path):
    """The check is not blind: the upward import mmte.data once had (the tokenizer registry, inside a
    function, relative) is found in a copy of the module and placed above data."""
    bad = tmp_path / "mmte" / "data" / "collate.py"
    bad.parent.mkdir(parents=True)
    bad.write_text((PKG / "data" / "collate.py").read_text() + "\n\ndef f():\n    from ..tokenizers.registry import MODALITIES\n")
    found = imported_modules(bad, tmp_path)
    assert found == [(found[-1][0], "mmte.tokenizers.registry")]
    assert FLOORS[unit_of("mmte.tokenizers.registry", UNITS)] == 3 > FLOORS["data"] == 2


@pytest.mark.parametrize("module", ["mmte.te", "mmte.parallel"])
def test_importing_a_unit_loads_nothing_beside_or_above_it(module):
    """In a fresh interpreter, ``import mmte.<unit>`` loads that unit and units on lower floors only
    (``mmte/__init__.py`` re-exports lazily); ``import mmte.te`` loads the engine alone."""
    code = f"import sys, {module}; print(' '.join(sorted(m for m in sys.modules if m.startswith('mmte'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    me = unit_of(module, UNITS)
    loaded = {unit_of(m, UNITS) for m in out} - {None}
    assert me in loaded and all(u == me or FLOORS[u] < FLOORS[me] for u in loaded), f"import {module} loaded {out}"
    if module == "mmte.te":
        assert loaded == {"te"}, out
