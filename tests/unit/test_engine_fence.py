"""engine_fence: one fence read two ways, live (inspect) and from sources (ast), with the same verdicts.

The 'engine' here is two small modules written to a temp package and imported for real: the
live check sees them as an engine process would, the source check reads the same files as
scripts/check_engines.py reads a wheel.  Each test changes one thing and both readers must see it.
"""
from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from engram_client import IntegrationError
from engram_client.integrations.engine_fence import Fence, check_live, fence_for, refuse_failures, shape
from engram_client.integrations.fence_sources import check_sources

HELPERS = """
SHM_PATH = "/dev/shm"


def check_space(required_bytes, shm_path=SHM_PATH, *, allocation_name="allocation"):
    return required_bytes
"""

ENGINE = """
import functools

from .helpers import check_space
from .helpers import check_space as renamed

DEAD_ID = -1


def wrapped(fn):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, **kwargs)
    return inner


class Storage:
    def __init__(self, rows, dim, /, group=None, *args, flag=True, **kwargs):
        self.rows = [check_space(row) for row in range(rows)]  # a comprehension's names count too

    @wrapped
    def lookup(self, ids, out):
        return self.gather(ids, DEAD_ID)
"""


def fence(**changes) -> Fence:
    engram = "fakeengine.engram"
    fields = dict(
        engine="fakeengine", version="1.0",
        signatures={engram: {"Storage.__init__": "(self, rows, dim, /, group=None, *args, flag=True, **kwargs)",
                             "Storage.lookup": "(self, ids, out)",
                             "check_space": "(required_bytes, shm_path='/dev/shm', *, allocation_name='allocation')",
                             "renamed": "(required_bytes, shm_path='/dev/shm', *, allocation_name='allocation')"}},
        calls={engram: {"Storage.__init__": ("check_space",), "Storage.lookup": ("gather", "DEAD_ID")}},
        names={engram: ("Storage", "wrapped")},
        constants={engram: {"DEAD_ID": -1}},
        avoids={engram: {"Storage.__init__": ("share_host_table",)}},
    )
    fields.update(changes)
    return Fence(**fields)


@pytest.fixture
def engine(tmp_path, monkeypatch):
    package = tmp_path / "fakeengine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text(textwrap.dedent(HELPERS))
    (package / "engram.py").write_text(textwrap.dedent(ENGINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name.startswith("fakeengine")]:
        del sys.modules[name]

    def read(module: str):
        path = tmp_path / (module.replace(".", "/") + ".py")
        return path.read_text() if path.exists() else None

    return read


def verdicts(findings) -> list[tuple[str, str, bool]]:
    return [(f.kind, f.item, f.ok) for f in findings]


def test_live_and_source_checks_pass_the_same_items(engine):
    live = check_live(fence(), importlib.import_module)
    static = check_sources(fence(), engine)
    assert verdicts(live) == verdicts(static)
    assert all(f.ok for f in live), [f.line() for f in live if not f.ok]
    assert len(live) == 10  # 4 signatures, 2 calls, 2 names, 1 constant, 1 avoided


@pytest.mark.parametrize("changes, failing", [
    ({"signatures": {"fakeengine.engram": {"Storage.lookup": "(self, ids, out, background=False)"}}},
     "Storage.lookup"),
    ({"calls": {"fakeengine.engram": {"Storage.lookup": ("gather", "scatter")}}}, "Storage.lookup"),
    ({"names": {"fakeengine.engram": ("Gone",)}}, "Gone"),
    ({"constants": {"fakeengine.engram": {"DEAD_ID": -2}}}, "DEAD_ID"),
    ({"avoids": {"fakeengine.engram": {"Storage.__init__": ("check_space",)}}}, "Storage.__init__"),
    ({"signatures": {"fakeengine.missing": {"f": "()"}}}, "(import)"),
])
def test_a_difference_fails_in_both_readers_and_names_the_item(engine, changes, failing):
    live = [f for f in check_live(fence(**changes), importlib.import_module) if not f.ok]
    static = [f for f in check_sources(fence(**changes), engine) if not f.ok]
    assert len(live) == len(static) == 1
    assert failing in live[0].line() and (failing in static[0].line() or failing == "(import)")
    with pytest.raises(IntegrationError, match="cannot patch fakeengine 1.0"):
        refuse_failures(fence(**changes), live, "switch it off")


def test_an_unknown_version_is_refused_naming_the_supported_ones_and_the_pin():
    fences = {"1.0": fence(), "1.1": fence(version="1.1")}
    assert fence_for(fences, "fakeengine", "1.1", "engramd[fake]").version == "1.1"
    with pytest.raises(IntegrationError, match=r"run against fakeengine 1.0, 1.1 only; this is fakeengine 2.0.*"
                                               r"fakeengine==1.1"):
        fence_for(fences, "fakeengine", "2.0", "engramd[fake]")


def test_shape_writes_every_kind_of_parameter():
    def f(a, /, b, c="x", *args, d=1.0, **kwargs):
        pass

    assert shape(f) == "(a, /, b, c='x', *args, d=1.0, **kwargs)"
