"""The durable record of what a daemon serves, and the restart rule built on it."""
from __future__ import annotations

import os
import stat

from engramd.daemon.served_record import read_record, record_path, resume_target, write_record


def test_a_record_round_trips_owner_only(tmp_path):
    path = record_path(str(tmp_path), "0123456789ab")
    write_record(path, "/models/a", "/models/b")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_record(path) == {"configured": "/models/a", "served": "/models/b"}
    assert [name for name in os.listdir(tmp_path)] == [os.path.basename(path)]  # no temporary left


def test_the_reload_target_is_resumed_only_from_the_same_configuration(tmp_path):
    path = record_path(str(tmp_path), "0123456789ab")
    assert resume_target(path, "/models/a") is None
    write_record(path, "/models/a", "/models/b")
    assert resume_target(path, "/models/a") == "/models/b"
    assert resume_target(path, "/models/c") is None  # the operator changed --checkpoint: that wins
    write_record(path, "/models/a", "/models/a")  # serving --checkpoint again: nothing to remember
    assert not os.path.exists(path) and resume_target(path, "/models/a") is None


def test_an_untrusted_or_damaged_record_is_ignored(tmp_path):
    path = record_path(str(tmp_path), "0123456789ab")
    with open(path, "w") as f:
        f.write('{"configured": "/models/a", "served": "/evil"}')
    os.chmod(path, 0o666)
    assert resume_target(path, "/models/a") is None
    os.chmod(path, 0o600)
    assert resume_target(path, "/models/a") == "/evil"  # the daemon still checks it is under a reload root
    with open(path, "w") as f:
        f.write("[1, 2")
    assert read_record(path) is None
    os.unlink(path)
    os.symlink(str(tmp_path / "elsewhere"), path)
    assert read_record(path) is None
