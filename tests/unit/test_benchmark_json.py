"""Every benchmark's --json goes through benchmarks/common.py's write_json, which sets a ``meta`` object
beside the results; the report generator reads exactly these keys, so they are pinned here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.common import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_meta_keys_are_pinned(tmp_path):
    path = tmp_path / "out.json"
    write_json(str(path), {"rows": 6144})
    written = json.loads(path.read_text())
    assert written["rows"] == 6144
    meta = written["meta"]
    assert set(meta) == {"command", "commit", "date", "machine"}
    assert set(meta["machine"]) == {"gpu", "cpus", "host"}
    assert meta["machine"]["cpus"] == os.cpu_count()
    assert meta["machine"]["gpu"] is None or isinstance(meta["machine"]["gpu"], str)
    assert len(meta["date"]) == 10 and meta["date"][4] == "-"  # an ISO date, YYYY-MM-DD
    assert meta["commit"] is None or isinstance(meta["commit"], str)


def test_a_list_of_results_sits_under_results(tmp_path):
    path = tmp_path / "out.json"
    write_json(str(path), [{"block_rows": 8}])
    assert json.loads(path.read_text())["results"] == [{"block_rows": 8}]


def test_no_path_writes_nothing(tmp_path, capsys):
    write_json(None, {"rows": 1})
    assert capsys.readouterr().out == ""


def test_the_command_names_the_module_and_its_arguments_as_given(tmp_path):
    """A real ``python -m`` run: the meta's command is what a reader types to measure it again."""
    script = ("import sys; from benchmarks.common import write_json; write_json('-', {'x': 1})")
    package = tmp_path / "probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "run.py").write_text(script + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-m", "probe_pkg.run", "--daemon-args", "--decode-cpus 2"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    meta = json.loads(out)["meta"]
    assert meta["command"] == "python -m probe_pkg.run --daemon-args '--decode-cpus 2'"
