"""The human status: every field the status object has, in words; the hashing line exactly when the
table carries a token map."""
from __future__ import annotations

import pytest

from engramd.daemon.config import ServeConfig
from engramd.daemon.state_machine import Daemon
from engramd.reporting.status_text import SHOWN_FIELDS, print_status, render_status


@pytest.fixture
def daemon(tmp_path):
    daemon = Daemon(ServeConfig(shm_dir=str(tmp_path), endpoint="ipc:///tmp/x-status-text.sock"))
    yield daemon
    daemon.shm.close()


def test_every_field_of_the_status_object_is_rendered(daemon):
    assert set(daemon.status()) == SHOWN_FIELDS, "a status field the text does not show (or shows no more)"


def full_status() -> dict:
    """A status after a reload: generation 2 served, 1 retiring with a client still on it."""
    return {
        "state": "ready", "error": None, "generation": 2, "boot_id": "boot-4f1c", "version": "9.8.7",
        "pid": 4242, "started_at": 1_800_000_000.0, "checkpoint": "/models/r2", "fingerprint": "fp-77aa",
        "table_path": "/dev/shm/engramd-x-g2.table", "table_bytes": 5 * 2**20, "adopted": True,
        "numa_node": 1, "shm_dir": "/dev/shm/here", "files": ["model-1.safetensors", "model-2.safetensors"],
        "layers": [{"layer": 3, "rows": 307, "head_dim": 256, "head_sizes": [307]}],
        "load": {"done_bytes": 5 * 2**20, "total_bytes": 5 * 2**20},
        "reload": {"generation": 3, "checkpoint": "/models/r3", "state": "failed", "error": "bad shard",
                   "load": {"done_bytes": 0, "total_bytes": 10}},
        "generations": [
            {"generation": 2, "state": "ready", "checkpoint": "/models/r2", "path": "/dev/shm/engramd-x-g2.table",
             "clients": 1, "adopted": True, "error": None, "retiring": False, "load": {}},
            {"generation": 1, "state": "ready", "checkpoint": "/models/r1", "path": "/dev/shm/engramd-x-g1.table",
             "clients": 1, "adopted": False, "error": None, "retiring": True, "load": {}}],
        "clients": [
            {"id": "c1-10", "pid": 10, "host": "node7", "rank": None, "device": "cpu", "generation": 1,
             "attached_at": 1_800_000_100.0, "last_heartbeat_age_s": 0.5,
             "cache": {"hits": 3000, "misses": 1000, "fetched": 990, "bytes": 2**30, "fixed_rows": 5000,
                       "recent_rows": 7000}},
            {"id": "c2-11", "pid": 11, "host": "node7", "rank": 0, "device": "cuda:0", "generation": 2,
             "attached_at": 1_800_000_200.0, "last_heartbeat_age_s": 1.25, "numa_node": 1,
             "replica": {"node": 1, "path": "/dev/shm/engramd-x-g2-n1.table"},
             "budget": {"slot": 3, "group": 0, "tokens": 14, "threads": 14, "cpus": "0-13", "held": 2,
                        "rows": 1234567, "wait_s": 0.25, "acquired": 90, "yields": 40, "overdraft": 0}}],
        "clients_total": 70, "lease_seconds": 7.5, "events_endpoint": "ipc:///run/engramd.sock.events",
        "hashing": {"vocab": 400, "compressed_vocab": 311, "max_ngram": 3, "pad_token_id": 2},
        "gather_budget": {"id": "boot-4f1c", "socket": "/run/engramd.sock.budget", "tokens": 14, "groups": [
            {"group": 0, "node": 1, "cpus": "0-13", "tokens": 14, "locked": 5, "peak_gathering": 14,
             "grants": 9876, "dead_slots_swept": 1}]},
        "huge_pages": {"bytes": 5 * 2**20, "huge_bytes": 4 * 2**20, "coverage": 0.8, "page_bytes": 2**21},
        "hot_rows": {"path": "/dev/shm/engramd-x-g2.hot", "source": "/etc/engramd/code.hot", "bytes": 3 * 2**20,
                     "sha256": "ab" * 32, "layers": {"3": 6140},
                     "built_from": {"tokens": 1234000, "files_total": 7, "built_at": "2026-12-01T10:00:00+00:00"}},
        "hot_rows_error": None,
        "replicas": [{"node": 0, "path": "/dev/shm/engramd-x-g2.table", "bytes": 5 * 2**20,
                      "huge_pages": {"bytes": 5 * 2**20, "huge_bytes": 4 * 2**20, "coverage": 0.8, "page_bytes": 2**21}},
                     {"node": 1, "path": "/dev/shm/engramd-x-g2-n1.table", "bytes": 5 * 2**20, "huge_pages": None}],
    }


def test_the_text_states_each_value():
    status = full_status()
    assert set(status) == SHOWN_FIELDS
    text = "\n".join(render_status(status))
    for needle in ("ready", "generation  2 (re-adopted", "boot-4f1c", "9.8.7", "pid 4242", "/models/r2",
                   "fp-77aa", "/dev/shm/engramd-x-g2.table", "5.0 MiB", "/dev/shm/here", "model-1.safetensors",
                   "model-2.safetensors", "layer   3: 307 rows x 256, 1 head", "generation 3 from /models/r3: failed",
                   "bad shard", "numa node   1", "clients     70 ", "the oldest 2 listed", "400 token ids -> 311 compressed", "7.5 s", "ipc:///run/engramd.sock.events", "node7", "cuda:0",
                   "node budget of 14 tokens", "/run/engramd.sock.budget", "group 0 (NUMA node 1): 14 tokens on CPUs 0-13",
                   "5 held now", "at most 14 gathering at once", "9,876 grants", "1 dead rank's slot swept",
                   "slot 3, 14 threads on CPUs 0-13", "1,234,567 rows gathered", "0.250 s waited for tokens",
                   "80% of the table (4.0 MiB of 5.0 MiB) on huge pages of 2.0 MiB",
                   "hot rows    /dev/shm/engramd-x-g2.hot (from /etc/engramd/code.hot, 3.0 MiB): layer 3: 6,140 rows; "
                   "built from 1,234,000 tokens of 7 files at 2026-12-01T10:00:00+00:00",
                   "row cache: 75.0% hits (3,000 hits, 1,000 misses), 990 rows fetched from host memory; 1.00 GiB of "
                   "HBM holding 5,000 listed and 7,000 recent rows",
                   "replicas    2 (one table copy per NUMA node", "node 0: /dev/shm/engramd-x-g2.table, 5.0 MiB, 80% on "
                   "huge pages", "node 1: /dev/shm/engramd-x-g2-n1.table, 5.0 MiB, huge pages not measured",
                   "maps the replica of NUMA node 1: /dev/shm/engramd-x-g2-n1.table (its own node: 1)"):
        assert needle in text, f"{needle!r} missing from:\n{text}"
    assert "None" not in text, text
    lines = text.splitlines()
    retiring = next(line for line in lines if "generation 1 " in line and "retiring" in line)
    assert "1 client still on it" in retiring and "/dev/shm/engramd-x-g1.table" in retiring
    old_client = next(line for line in lines if "c1-10" in line)
    assert "no rank" in old_client and "generation 1 (old)" in old_client
    assert "rank 0" in next(line for line in lines if "c2-11" in line)


def status(hashing: dict | None) -> dict:
    return {"state": "ready", "error": None, "generation": 3, "boot_id": "b1", "pid": 42, "checkpoint": "/ckpt",
            "table_bytes": 3 * 2**20, "table_path": "/dev/shm/engramd/table-3",
            "layers": [{"layer": 1, "rows": 1000, "head_dim": 32, "head_sizes": [499, 501]}],
            "hashing": hashing, "reload": None, "numa_node": None, "clients": []}


def test_a_table_with_a_token_map_prints_its_hashing_facts(capsys: pytest.CaptureFixture[str]):
    print_status(status({"vocab": 400, "compressed_vocab": 311, "max_ngram": 3, "pad_token_id": 2}))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hashing")]
    assert lines == ["hashing     400 token ids -> 311 compressed, n-grams up to 3, pad token 2"]


def test_a_table_without_a_token_map_prints_no_hashing_line(capsys: pytest.CaptureFixture[str]):
    print_status(status(None))
    out = capsys.readouterr().out
    assert "layer   1: 1000 rows x 32, 2 heads" in out
    assert "hashing" not in out


def lines_of(status: dict, start: str) -> list[str]:
    return [line.strip() for line in render_status(status) if line.strip().startswith(start)]


def test_a_status_line_never_contradicts_another_nor_prints_none():
    # Each of these was seen in a normal run (docs/RELIABILITY.md, "Operating it").
    status = full_status()
    status["clients"][0]["cache"] = {"hits": 0, "misses": 0, "fetched": 180224, "bytes": 2**30, "fixed_rows": 180224,
                                     "recent_rows": 1}
    status["clients"][1]["replica"] = {"node": None, "path": "/dev/shm/engramd-x-g2.table"}
    status["clients"][1]["numa_node"] = None
    status["gather_budget"]["tokens"] = status["gather_budget"]["groups"][0]["tokens"] = 1
    text = "\n".join(render_status(status))
    assert "None" not in text, text
    # "no lookups yet (0 hits, 0 misses), 180,224 rows fetched": rows read before any lookup filled the cache
    assert lines_of(status, "row cache") == ["row cache: no lookups yet; 180,224 rows read from host memory to fill "
                                             "it; 1.00 GiB of HBM holding 180,224 listed and 1 recent row"]
    # a client without a cache: its gathers' rows are not a cache's fill
    status["clients"][0]["cache"] = {"hits": 0, "misses": 0, "fetched": 180224, "bytes": 0, "fixed_rows": 0,
                                     "recent_rows": 0}
    assert lines_of(status, "row cache") == ["row cache: none (hot_cache_bytes 0): every row is read from host memory"]
    assert lines_of(status, "maps the") == ["maps the table, which is bound to no NUMA node: "
                                            "/dev/shm/engramd-x-g2.table (its own node: unknown)"]
    assert lines_of(status, "gather      ")[0].startswith("gather      node budget of 1 token, handed out")
    assert "group 0 (NUMA node 1): 1 token on CPUs 0-13" in text


def test_a_failed_load_is_not_said_to_be_loaded():
    status = full_status()
    status.update(state="failed", error="bad shard", adopted=False, table_path=None)
    assert lines_of(status, "generation  ") == ["generation  2 (its load failed)"]
    status.update(state="loading", error=None)
    assert lines_of(status, "generation  ") == ["generation  2 (loading)"]
