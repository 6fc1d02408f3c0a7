"""engramd's SGLang plugin driven by SGLang 0.5.23's call sequence: four ranks, a real daemon, real checkpoints.

SGLang is not installed here and its Engram code runs on GPUs only, so the ranks run the
stand-in in tests/support/sglang_standin (its docstring says what it replays).  Four processes are two
SGLang replicas (DP 2) of TP 2, each replica's ranks joined by a real torch.distributed gloo
group, looking rows up on device="cpu" (the GPU twin is tests/gpu/test_sglang_plugin_gpu.py).
SGLang's host-table and staging knobs are set for every rank, as a user coming from SGLang's
own host table would have them.  While the ranks hold after their first lookups, the test
kills one and starts it again (it re-attaches and serves), then stops the daemon and starts
another on the same socket and shm dir (the three running ranks re-attach and keep serving).
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile

import pytest

from conftest import DaemonProcess
from sglang_ranks import finish, free_port, outcome, rank_env, rank_spec, start_rank, write_checkpoints
from waiting import wait_for

TP, DP = 2, 2
SCENARIOS = ["unreachable", "other_layout", "peer_shards", "serve", "other_weights", "hold", "again"]
KNOBS = {"SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "1", "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT": "per_rank",
         "SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING": "1"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("sglang"))
    checkpoints = write_checkpoints(root)
    socket_dir = tempfile.mkdtemp(prefix="engt-")
    shm_dir = tempfile.mkdtemp(prefix="engt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    daemon_args = ("--checkpoint", checkpoints["served"], "--lease-seconds", "1.5")
    daemons = [DaemonProcess(socket_dir, shm_dir, *daemon_args).start()]
    ranks = []
    try:
        first_status = daemons[0].wait_state("ready")
        env = rank_env(daemons[0].endpoint, **KNOBS)
        port = free_port()
        specs = [rank_spec(rank, TP, DP, port, "cpu", SCENARIOS, root, checkpoints) for rank in range(TP * DP)]
        ranks = [start_rank(spec, env) for spec in specs]
        first = [outcome(p, spec["out"], "other_weights", 150) for p, spec in zip(ranks, specs)]
        attached = daemons[0].status()["clients"]

        # A rank restart: rank 3 dies (SIGKILL) and starts again, re-attaching on its own.
        ranks[3].send_signal(signal.SIGKILL)
        ranks[3].wait(timeout=30)
        again_spec = rank_spec(3, TP, DP, free_port(), "cpu", ["serve"], root, checkpoints, alone=True,
                               out=os.path.join(root, "rank3-restarted.json"))
        restarted = start_rank(again_spec, env)
        finish([restarted])
        restarted_outcome = outcome(restarted, again_spec["out"], "serve", 5)
        after_rank_restart = wait_for(lambda: (lambda c: c if len(c) == TP * DP else None)(
            [c["id"] for c in daemons[0].status()["clients"]]),
            "the daemon did not drop the killed rank's lease and list the restarted one", 30)

        # A daemon restart under the three running ranks: stopped, another on the same socket and shm dir.
        daemons[0].connection.request("stop")
        assert daemons[0].proc.wait(timeout=30) == 0
        daemons.append(DaemonProcess(socket_dir, shm_dir, *daemon_args).start())
        second_status = daemons[1].wait_state("ready")
        wait_for(lambda: len(daemons[1].status()["clients"]) == TP * DP - 1,
                 "the three running ranks did not re-attach to the restarted daemon", 30)
        with open(specs[0]["go"], "w"):
            pass
        outputs = finish([ranks[0], ranks[1], ranks[2]])
        last = [outcome(p, spec["out"], "again", 5) for p, spec in zip(ranks[:3], specs[:3])]
        yield {"first": first, "last": last, "restarted": restarted_outcome, "outputs": outputs,
               "checkpoints": checkpoints, "status": (first_status, second_status), "attached": attached,
               "after_rank_restart": after_rank_restart, "killed_client": first[3]["serve"]["client_id"]}
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        for daemon in daemons:
            daemon.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)


def test_every_rank_gets_sglangs_rows_bit_exact_with_padding_and_dead_ids(engine):
    for rank, outcome in enumerate(engine["first"]):
        serve = outcome["serve"]
        assert serve["mismatches"] == [], f"rank {rank}"  # after the TP all-reduce, and this rank's part before it
        assert serve["lookup_device"] == "cpu"


def test_each_tp_rank_registers_only_sglangs_rows_for_it(engine):
    first = engine["first"]
    for rank, outcome in enumerate(first):
        serve = outcome["serve"]
        assert serve["registered"] == serve["sglang_rows"], f"rank {rank}"
        assert serve["registered"] == first[rank % TP]["serve"]["registered"]  # the other replica's same TP rank
    for layer, (lo, hi) in first[0]["serve"]["registered"].items():
        assert lo == 0 and hi == first[1]["serve"]["registered"][layer][0]
        served = next(entry for entry in engine["status"][0]["layers"] if str(entry["layer"]) == layer)
        assert first[1]["serve"]["registered"][layer][1] == served["rows"]


def test_no_rank_holds_a_table_and_the_scheduler_stages_nothing(engine):
    for outcome in engine["first"]:
        assert outcome["serve"]["params_on_meta"] and not outcome["serve"]["stager"]


def test_sglangs_host_table_knobs_are_explained_once_each(engine):
    output = engine["outputs"][0]
    for knob, value in KNOBS.items():
        assert output.count(f"{knob}={value} has no effect with ENGRAMD_SGLANG=1") == 1, output


def test_peer_shards_are_refused_on_every_rank(engine):
    for outcome in engine["first"]:
        error = outcome["peer_shards"]["error"]
        assert error.startswith("IntegrationError: engramd cannot serve SGLang's Engram table")
        assert "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS=1" in error and "unset one of the two" in error


def test_no_daemon_fails_the_build_on_every_rank_of_the_tp_group(engine):
    messages = {outcome["unreachable"]["error"] for outcome in engine["first"]}
    assert len(messages) == DP, messages  # one error per replica, the same on both of its TP ranks
    for message in messages:
        assert "no-daemon-here.sock: socket file missing" in message and "ENGRAMD_SOCKET" in message
        assert "ranks 0, 1" in message or "ranks 2, 3" in message


def test_a_checkpoint_of_another_layout_is_refused_naming_both(engine):
    checkpoints = engine["checkpoints"]
    for outcome in engine["first"]:
        error = outcome["other_layout"]["error"]
        assert f"SGLang's model {checkpoints['other_layout']}" in error
        assert f"serving checkpoint {checkpoints['served']}" in error


def test_other_rows_in_the_same_layout_are_refused_at_finish_load(engine):
    checkpoints = engine["checkpoints"]
    for outcome in engine["first"]:
        error = outcome["other_weights"]["error"]
        assert error.startswith("IntegrationError: the Engram weights SGLang loads are not the table engramd serves")
        assert f"SGLang's model {checkpoints['other_weights']}" in error and "vLLM" not in error
        assert "engram.embed.weight row" in error or "engram.embed.scale row" in error


def test_a_restarted_rank_reattaches_and_serves_its_rows(engine):
    restarted = engine["restarted"]["serve"]
    assert restarted["mismatches"] == []
    assert restarted["client_id"] in engine["after_rank_restart"]
    assert engine["killed_client"] not in engine["after_rank_restart"]


def test_running_ranks_reattach_to_a_restarted_daemon_and_keep_serving(engine):
    second = engine["status"][1]
    assert second["boot_id"] != engine["status"][0]["boot_id"]
    for rank, outcome in enumerate(engine["last"]):
        assert outcome["again"]["mismatches"] == [], f"rank {rank}"
        assert outcome["again"]["boot_id"] == second["boot_id"], f"rank {rank}"
        assert outcome["again"]["pid"] == outcome["serve"]["pid"]
