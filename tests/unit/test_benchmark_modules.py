"""Every benchmark runs as ``python -m benchmarks.<group>.<name>``: each module imports (what --help
needs before it parses anything) and the usage line in its docstring names that same module."""
from __future__ import annotations

import importlib
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")


def benchmark_modules() -> list[str]:
    """The modules with a main (helpers such as engine/model.py are imported by one that has)."""
    found = []
    for group in sorted(os.listdir(BENCHMARKS)):
        folder = os.path.join(BENCHMARKS, group)
        if not os.path.isfile(os.path.join(folder, "__init__.py")):
            continue
        for file in sorted(os.listdir(folder)):
            if file.endswith(".py") and file != "__init__.py":
                with open(os.path.join(folder, file)) as f:
                    if 'if __name__ == "__main__":' in f.read():
                        found.append(f"benchmarks.{group}.{file[:-3]}")
    return found


def test_the_benchmarks_are_grouped():
    names = benchmark_modules()
    assert {name.split(".")[1] for name in names} == {"lookups", "node", "engine", "cache", "daemon"}
    assert "benchmarks.engine.e2e" in names and "benchmarks.daemon.load_clients" in names
    assert sorted(f for f in os.listdir(BENCHMARKS) if f.endswith(".py")) == ["__init__.py", "busy_neighbours.py", "common.py"]


@pytest.mark.parametrize("name", benchmark_modules())
def test_a_benchmark_imports_and_its_usage_names_it(name):
    module = importlib.import_module(name)
    assert callable(module.main), name
    assert f"python -m {name}" in module.__doc__, f"{name}'s docstring gives no 'python -m {name}' usage line"
