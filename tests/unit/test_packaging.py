"""What a user of the package expects to find: the license pyproject names, PEP 561 markers, annotations."""
from __future__ import annotations

import importlib
import inspect
import pathlib
import tomllib

import click
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Modules whose every public function and method must be fully annotated (the client library's
# error tree, connection and readiness wait, and the command line's own modules).
ANNOTATED_MODULES = [
    "engram_client.core.errors", "engram_client.attach.connection", "engram_client.attach.readiness", "engramd.cli.main",
    "engramd.cli.error_map", "engramd.cli.reach", "engramd.cli.status", "engramd.reporting.status_text", "engramd.cli.serve", "engramd.reporting.sizes", "engramd.shm.fs_check",
    "engramd.synth.target", "engramd.guards.lock_owner", "engramd.reporting.progress",
]


def test_the_license_file_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert text.count("\n") > 190, "the full text, not a pointer to it"


@pytest.mark.parametrize("package", ["engramd", "engram_client"])
def test_packages_are_marked_typed_and_ship_the_marker(package):
    module = importlib.import_module(package)
    assert (pathlib.Path(module.__file__).parent / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data[package]


def _public_callables(module):
    for name, obj in vars(module).items():
        if isinstance(obj, click.Command) and obj.callback is not None:
            obj = obj.callback  # a command: its function holds the annotations
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__"):
                    yield f"{name}.{attr}", member
        elif inspect.isfunction(obj):
            yield name, obj


@pytest.mark.parametrize("module_name", ANNOTATED_MODULES)
def test_public_functions_are_fully_annotated(module_name):
    module = importlib.import_module(module_name)
    missing = []
    for name, function in _public_callables(module):
        signature = inspect.signature(function)
        for param in signature.parameters.values():
            if param.name in ("self", "cls"):
                continue
            if param.annotation is inspect.Parameter.empty:
                missing.append(f"{name}({param.name})")
        if signature.return_annotation is inspect.Signature.empty:
            missing.append(f"{name} -> ?")
    assert not missing, f"{module_name}: not annotated: {', '.join(missing)}"


def test_the_vllm_plugin_is_a_registered_general_plugin_and_its_extra_pins_the_checked_release():
    from engram_client.integrations.vllm import register
    from engram_client.integrations.vllm.fence import CHECKED_VERSIONS

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {"engramd": "engram_client.integrations.vllm:register"}
    assert f"vllm=={CHECKED_VERSIONS[-1]}" in project["optional-dependencies"]["vllm"]
    installed = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "engramd"]
    assert len(installed) == 1 and installed[0].load() is register  # what vLLM's plugin loader finds
