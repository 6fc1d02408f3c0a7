"""write_then_rename (engramd/guards/whole_files.py) on a temporary name someone else already holds:
it refuses, leaves that file as it was and the final name unwritten, and reports the failure in the
caller's error class: an OSError keeps its errno and the file's name (the served record's caller
reads them), another class gets a message naming the file."""
from __future__ import annotations

import errno
import os

import pytest

from engram_client.core.errors import HotListError
from engramd.guards.whole_files import write_then_rename


@pytest.mark.parametrize("error", [OSError, HotListError])
def test_a_temporary_that_exists_is_left_alone_and_the_failure_named(tmp_path, error):
    temporary, final = tmp_path / "list.tmp-1", tmp_path / "list"
    temporary.write_bytes(b"someone else's")
    with pytest.raises(error) as raised:
        write_then_rename(str(temporary), str(final), b"ours", error)
    if error is OSError:
        assert raised.value.errno == errno.EEXIST and raised.value.filename == str(temporary)
    else:
        assert str(raised.value) == f"cannot create {temporary}: {os.strerror(errno.EEXIST)}"
    assert temporary.read_bytes() == b"someone else's" and not final.exists()
