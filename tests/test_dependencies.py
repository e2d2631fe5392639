"""Every third-party package the installed code imports is one pyproject.toml declares itself. One that only
comes with another (numpy came with transformers, a test extra) is missing from a plain install: `make app`
and the frozen app both failed at their first import of it."""

import re
import sys
from importlib import metadata

import pytest

from tests.test_layering import ROOT, imports, top

tomllib = pytest.importorskip("tomllib")     # Python 3.11 on

SHIPPED = ("app", "engine", "qwendesk_kernels")
# imports of a test extra, each only in a benchmark that says so and goes on without it
OPTIONAL = {"transformers": {"engine/bench/suite.py", "engine/bench/kv_quality.py"}}


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return {normalised(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in project["dependencies"]}


def third_party_imports() -> dict[str, set[str]]:
    """top-level module -> the files that import it, for modules outside the standard library and this repo."""
    found: dict[str, set[str]] = {}
    for package in SHIPPED:
        for path, module in imports(package):
            name = top(module)
            if name not in sys.stdlib_module_names and name not in (*SHIPPED, "__future__"):
                found.setdefault(name, set()).add(path)
    return found


def test_every_third_party_import_is_a_declared_dependency():
    distributions = metadata.packages_distributions()
    undeclared = {}
    for name, paths in third_party_imports().items():
        if name in OPTIONAL:
            assert paths <= OPTIONAL[name], f"{name} (a test extra) imported by {sorted(paths - OPTIONAL[name])}"
            continue
        owners = {normalised(d) for d in distributions.get(name, [name])}
        if not owners & declared():
            undeclared[name] = sorted(paths)[:3]
    assert not undeclared, f"imported but not in pyproject.toml's dependencies: {undeclared}"


def test_signal_emits_keep_their_references(qapp):
    """PySide6 6.12.0 on Python 3.11 (whose True is not immortal) dropped a reference to True on every
    Signal.emit: the app died (bool_dealloc) after a few hundred, e.g. the tokens of one long reply. (pytest-qt's
    `qapp`, a QApplication: a QCoreApplication made here would be the one every later GUI test found, and fail them.)"""
    from PySide6.QtCore import QObject, Signal

    class Source(QObject):
        fired = Signal(object)

    source = Source()
    seen = []
    source.fired.connect(seen.append)
    before = sys.getrefcount(True)
    for i in range(200):
        source.fired.emit(i)
    assert len(seen) == 200
    assert sys.getrefcount(True) >= before - 20      # a real leak loses 200


def test_constraints_pin_every_requirement_within_its_range():
    """constraints.txt (`make lock`) pins each requirement of the app and its tests, at a version the requirement
    allows: a requirement added or raised in pyproject.toml without a new lock fails here, not in a CI install."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[normalised(name)] = version
    for text in project["dependencies"] + project["optional-dependencies"]["test"]:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = normalised(req.name)
        assert name in pins, f"{req.name} is not in constraints.txt: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt pins {name}=={pins[name]}: {req}"
