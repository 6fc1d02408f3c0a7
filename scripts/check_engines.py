"""Every integration fence checked against the engines' real releases, from their wheels' sources.

    python scripts/check_engines.py vllm-0.33.0-*.whl vllm-0.34.0-*.whl sglang-0.5.23-*.whl

Get the wheels with ``pip download --no-deps vllm==0.34.0`` (and so on; hundreds of MB, so this
is not part of the test suite).  Nothing of an engine is imported or installed: each wheel is
read as a zip, its name and version from its METADATA, and each module a fence names is parsed
from its source (engram_client/integrations/fence_sources.py), so any Python
with engram_client on its path runs it, whatever torch the engine wants.

It prints one line per checked item (``ok`` or ``FAIL``), then one line per fence of the
project that no wheel given covered, and exits 0 iff every item of every wheel's fence holds;
1 if any does not, or a wheel is of a release no fence covers; 2 on a file that is no wheel.
Run it before every change to an integration.
"""
from __future__ import annotations

import email.parser
import os
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from engram_client import IntegrationError  # noqa: E402
from engram_client.integrations.engine_fence import ENGINES, engine_fences  # noqa: E402
from engram_client.integrations.fence_sources import check_sources  # noqa: E402


def wheel_release(wheel: zipfile.ZipFile) -> tuple[str, str]:
    """(name, version) from the wheel's METADATA, the name normalized as pip does."""
    metadata = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    if len(metadata) != 1:
        raise ValueError(f"it has {len(metadata)} .dist-info/METADATA files, expected one")
    headers = email.parser.Parser().parsestr(wheel.read(metadata[0]).decode("utf-8", "replace"), headersonly=True)
    return headers["Name"].lower().replace("_", "-"), headers["Version"]


def source_reader(wheel: zipfile.ZipFile):
    files = set(wheel.namelist())

    def read(module: str) -> str | None:
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in files:
                return wheel.read(candidate).decode("utf-8")
        return None

    return read


def check_wheel(path: str, checked: set[tuple[str, str]]) -> bool:
    with zipfile.ZipFile(path) as wheel:
        engine, version = wheel_release(wheel)
        print(f"== {os.path.basename(path)}: {engine} {version}")
        if engine not in ENGINES:
            print(f"FAIL engramd has no integration for {engine} (it has {', '.join(ENGINES)})")
            return False
        fences = engine_fences(engine)
        if version not in fences:
            print(f"FAIL no fence for {engine} {version}: the integration was run against "
                  f"{', '.join(sorted(fences))} only")
            return False
        findings = check_sources(fences[version], source_reader(wheel))
    for finding in findings:
        print(finding.line())
    failed = sum(not finding.ok for finding in findings)
    print(f"-- {engine} {version}: {len(findings) - failed} of {len(findings)} items hold")
    checked.add((engine, version))
    return failed == 0


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    held, checked = True, set()
    for path in paths:
        try:
            held &= check_wheel(path, checked)
        except (OSError, zipfile.BadZipFile, ValueError, IntegrationError) as exc:
            print(f"check_engines: {path}: not a wheel this script can read: {exc}", file=sys.stderr)
            return 2
    for engine in ENGINES:
        for version in sorted(engine_fences(engine)):
            if (engine, version) not in checked:
                print(f"-- {engine} {version}: not checked (no wheel of it given)")
    print("every fence holds" if held else "some fence does not hold")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
