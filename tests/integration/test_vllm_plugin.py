"""engramd's vLLM plugin driven by vLLM 0.33.0's and 0.34.0's call sequences: four ranks, a real daemon.

vLLM is not installed here and its Engram code runs on GPUs only, so the ranks run the stand-in
in tests/support/vllm_standin (its docstring says what it replays of each release).  Per release, four
processes are one engine's TP 2 x DP 2, joined by a real torch.distributed gloo group, looking
rows up on device="cpu" (the GPU twin is tests/gpu/test_vllm_plugin_gpu.py).  While they run,
the daemon is killed and another started on the same socket; then the engine's ranks are
started again and re-attach.  Both releases' ranks run against one daemon serving one set of
checkpoints, once each for the module; each test reads what they saw.  The daemon restart and the
ranks started again run for the newest release only: re-attaching is the client's heartbeat and
attach, which no release's call sequence reaches (the releases differ in the room check, the
host-NUMA table and the dummy run, all in every release's run).  The ranks run where the host's
available memory is smaller than the table (STANDIN_AVAILABLE_MEMORY), as where engramd's table
already fills tmpfs: vLLM 0.34.0's own check would turn the DP-shared tables off there.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import DaemonProcess
from vllm_ranks import STANDIN, collect_ranks, restart_daemon_under, run_ranks, start_ranks, write_checkpoints

SCENARIOS = ["unreachable", "private_table", "other_layout", "serve", "dead_ids", "views", "other_weights"]
VERSIONS = ["0.33.0", "0.34.0"]
RESTARTED = VERSIONS[-1]  # the release whose ranks also live through a daemon restart and start again
TP, DP = 2, 2
TIGHT_MEMORY = {"STANDIN_AVAILABLE_MEMORY": str(64 << 10)}  # bytes: far less than the table


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """The daemon, the checkpoints, and per vLLM release the four ranks' outcomes (rank order: DP-major)."""
    root = tmp_path_factory.mktemp("vllm")
    checkpoints = write_checkpoints(str(root))
    socket_dir = tempfile.mkdtemp(prefix="engt-")
    shm_dir = tempfile.mkdtemp(prefix="engt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ("--checkpoint", checkpoints["served"], "--lease-seconds", "0.9")
    daemon = DaemonProcess(socket_dir, shm_dir, *args).start()
    try:
        before = daemon.wait_state("ready")
        runs = {}
        for version in VERSIONS:  # the newest last: its daemon restart ends the first daemon
            out_dir = os.path.join(socket_dir, version)  # each release's rank files, held-N and go apart
            os.mkdir(out_dir)
            tables = {name: os.stat(os.path.join(shm_dir, name)) for name in daemon.table_files()}
            shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
            run = {"version": version, "checkpoints": checkpoints, "status": daemon.status()}
            if version == RESTARTED:
                ranks = start_ranks(out_dir, daemon.endpoint, checkpoints, SCENARIOS + ["daemon_restart"], TP, DP,
                                    "cpu", version, TIGHT_MEMORY)
                daemon, after = restart_daemon_under(ranks, out_dir, daemon, *args)
                run["ranks"] = collect_ranks(out_dir, ranks)
                run["restarted"] = run_ranks(out_dir, daemon.endpoint, checkpoints, ["serve"], TP, DP, "cpu", version,
                                             TIGHT_MEMORY)
                run.update(boot_ids=(before["boot_id"], after["boot_id"]), status=daemon.status())
            else:
                run["ranks"] = run_ranks(out_dir, daemon.endpoint, checkpoints, SCENARIOS, TP, DP, "cpu", version,
                                         TIGHT_MEMORY)
            shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
            tables_after = {name: os.stat(os.path.join(shm_dir, name)) for name in daemon.table_files()}
            run.update(new_shm_files=shm_after - shm_before, tables=(tables, tables_after))
            runs[version] = run
        yield runs
    finally:
        daemon.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)


@pytest.fixture(params=VERSIONS)
def engine(request, releases):
    """One release's run."""
    return releases[request.param]


@pytest.fixture
def restarted(releases):
    """The run of the release whose ranks lived through a daemon restart and were started again."""
    return releases[RESTARTED]


def test_every_rank_gets_the_checkpoints_rows_bit_exact_on_every_head(engine):
    for rank, outcome in enumerate(engine["ranks"]):
        serve = outcome["serve"]
        assert serve["exact"], f"rank {rank}: {serve['mismatches']}"
        assert serve["padding_zero"], f"rank {rank}: vLLM's padding heads are not zero"
        assert serve["lookup_device"] == "cpu"
        assert serve["kept_eager_break"], "Engram._start_prefetch lost vLLM's eager_break_during_capture"
        assert serve["replayed"] == engine["version"]


ROOM_CHECKS = {"0.33.0": ["no_shm_table", "_shm_shortfall"], "0.34.0": ["check_shm_free_space", "no_shm_shortfall"]}


def test_each_version_has_its_own_room_check_replaced_and_the_decode_chain_decision_logged(engine):
    for outcome in engine["ranks"]:
        serve = outcome["serve"]
        # check_shm_free_space, _shm_shortfall: only the one the version's can_share_engram_tables asks is the plugin's
        assert serve["room_checks"] == ROOM_CHECKS[engine["version"]]
        assert f"engramd serves vLLM {engine['version']}'s Engram tables (ENGRAMD_VLLM=1)" in serve["plugin_log"]
        assert ("vLLM's specialized decode may run each Engram layer's WKV ahead on engramd's rows: it waits for "
                "Engram._prefetch_done, which the plugin records once they are in staged_rows") in serve["plugin_log"]
        assert not serve["decode_imported_at_plugin_load"]  # its fence items are read from the installed source


def test_vllm_0_34s_available_memory_check_does_not_turn_the_shared_tables_off(engine):
    for outcome in engine["ranks"]:
        serve = outcome["serve"]
        # vLLM 0.34.0 alone would have answered "exceeds the available host memory" and built no storage.
        assert serve["table_exceeds_available_memory"] and serve["dp_shared_memory"]
        assert serve["params_on_meta"]


def test_vllms_host_numa_table_is_never_reached(engine):
    assert all(outcome["serve"]["host_numa_calls"] == 0 for outcome in engine["ranks"])


def test_dead_ids_give_zero_rows_and_other_ids_outside_the_rows_are_still_refused(engine):
    for rank, outcome in enumerate(engine["ranks"]):
        dead = outcome["dead_ids"]
        # 0.33.0 skips Engram in dummy runs with DP-shared tables; 0.34.0 looks up all-DEAD rows.
        if engine["version"] == "0.33.0":
            assert dead["dummy_layers_looked_up"] == 0
        else:
            assert dead["dummy_layers_looked_up"] == 2 and dead["dummy_rows_zero"], rank
        assert dead["dead_ids"] > 0 and dead["mixed"]["exact"], (rank, dead["mixed"]["mismatches"])
        assert dead["mixed"]["padding_zero"]
        assert dead["bad_id_error"].startswith("IdsOutOfRangeError: 1 of "), dead["bad_id_error"]
        assert dead["after_error"]["exact"], rank


def test_ranks_keep_serving_through_a_daemon_restart_and_re_attach(restarted):
    first, second = restarted["boot_ids"]
    assert first != second
    for rank, outcome in enumerate(restarted["ranks"]):
        restart = outcome["daemon_restart"]
        assert restart["boot_ids"] == [first, second], rank
        assert restart["exact"] and not restart["refresh_pending"], (rank, restart["mismatches"])


def test_restarted_ranks_re_attach_and_get_the_rows_again(restarted):
    old = {outcome["serve"]["pid"] for outcome in restarted["ranks"]}
    for rank, outcome in enumerate(restarted["restarted"]):
        serve = outcome["serve"]
        assert serve["pid"] not in old and serve["exact"], (rank, serve["mismatches"])
        assert serve["registered"] == restarted["ranks"][rank]["serve"]["registered"]


def test_each_tp_rank_registers_only_the_rows_of_its_heads(engine):
    ranks = engine["ranks"]
    for rank, outcome in enumerate(ranks):
        serve = outcome["serve"]
        assert serve["registered"] == serve["vllm_rows"], f"rank {rank}"
        tp_rank = rank % TP
        assert serve["heads"] == ([0, 5, 5] if tp_rank == 0 else [5, 4, 5])  # 9 heads: 5 + 4 and a padding one
    for layer in ranks[0]["serve"]["registered"]:
        first, second = ranks[0]["serve"]["registered"][layer], ranks[1]["serve"]["registered"][layer]
        assert first[0] == 0 and first[1] == second[0] < second[1], (first, second)  # disjoint, and together whole
        served = next(lv for lv in engine["status"]["layers"] if str(lv["layer"]) == layer)
        assert second[1] == served["rows"]
        for dp_peer in range(TP, TP * DP):  # the same TP rank of the other replica registers the same rows
            assert ranks[dp_peer]["serve"]["registered"][layer] == ranks[dp_peer % TP]["serve"]["registered"][layer]


def test_no_rank_loads_or_writes_a_table_of_its_own(engine):
    for outcome in engine["ranks"]:
        assert outcome["serve"]["params_on_meta"], "vLLM's Engram parameters hold memory"
    assert not [name for name in engine["new_shm_files"] if name.startswith("vllm_engram_")]  # vLLM's own file name
    before, after = engine["tables"]
    assert before.keys() == after.keys() and before
    for name in before:
        assert (before[name].st_size, before[name].st_mtime_ns) == (after[name].st_size, after[name].st_mtime_ns)


def test_no_daemon_fails_the_model_load_on_every_rank_naming_the_endpoint(engine):
    messages = {outcome["unreachable"]["error"] for outcome in engine["ranks"]}
    assert len(messages) == 2, messages  # the same error on both ranks of each Engram DP group
    for message in messages:
        assert message.startswith("IntegrationError: engramd cannot serve vLLM's Engram table")
        assert "no-daemon-here.sock: socket file missing" in message and "ENGRAMD_SOCKET" in message
        assert "ranks 0, 2" in message or "ranks 1, 3" in message


def test_a_configuration_that_would_load_a_private_table_is_refused(engine):
    for outcome in engine["ranks"]:
        error = outcome["private_table"]["error"]
        assert error.startswith("IntegrationError: ") and "dp_shared_memory=False" in error
        assert "unset ENGRAMD_VLLM" in error


def test_a_checkpoint_of_another_layout_is_refused_naming_both(engine):
    checkpoints = engine["checkpoints"]
    for outcome in engine["ranks"]:
        error = outcome["other_layout"]["error"]
        assert error.startswith("IntegrationError: engramd cannot serve vLLM's Engram table")
        assert f"vLLM's model {checkpoints['other_layout']}" in error
        assert f"serving checkpoint {checkpoints['served']}" in error and "fingerprint" in error


def test_other_rows_in_the_same_layout_are_refused_when_vllm_loads_them(engine):
    checkpoints, status = engine["checkpoints"], engine["status"]
    for outcome in engine["ranks"]:
        error = outcome["other_weights"]["error"]
        assert error.startswith("IntegrationError: the Engram weights vLLM loads are not the table engramd serves")
        assert f"vLLM's model {checkpoints['other_weights']}" in error
        assert re.search(r"layers\.(1|14)\.engram\.embed\.(weight|scale) row \d+ differs from layer", error), error
        assert f"checkpoint {checkpoints['served']} (fingerprint {status['fingerprint']}" in error


def test_vllms_own_views_of_a_served_table_are_refused(engine):
    for outcome in engine["ranks"]:
        error = outcome["views"]["error"]
        assert error.startswith("IntegrationError: ") and "UVA views" in error


def plugin_load(env: dict[str, str]) -> subprocess.CompletedProcess:
    """vLLM's general-plugin load in a fresh process with the stand-in; prints what it left in place."""
    code = ("import sys\nfrom vllm.plugins import load_general_plugins\nload_general_plugins()\n"
            "engram = sys.modules.get('vllm.models.deepseek_v41.common.engram')\n"
            "print('patched' if engram and engram.DPSharedEngramStorage.__name__ == 'EngramdStorage' else "
            "'untouched' if engram is None else 'imported, not patched')\n")
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (STANDIN, os.environ.get("PYTHONPATH")) if p), **env}
    for name in ("ENGRAMD_VLLM", "STANDIN_VLLM_VERSION", "VLLM_PLUGINS"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run([sys.executable, "-P", "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_without_ENGRAMD_VLLM_the_plugin_leaves_vllm_untouched():
    result = plugin_load({})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "untouched"  # not even vLLM's Engram module was imported
    assert plugin_load({"ENGRAMD_VLLM": "0"}).stdout.strip() == "untouched"


def test_an_unchecked_vllm_version_is_refused_when_vllm_loads_the_plugin():
    result = plugin_load({"ENGRAMD_VLLM": "1", "STANDIN_VLLM_VERSION": "0.35.0"})
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last == ("engram_client.core.errors.IntegrationError: engramd's vllm integration was run against vllm "
                    "0.33.0, 0.34.0 only; this is vllm 0.35.0. Install one of those (pip install 'vllm==0.34.0', or "
                    "pip install 'engramd[vllm]', which pins the newest of them), or switch the integration off to "
                    "run vllm without engramd (unset ENGRAMD_VLLM)"), result.stderr


def test_an_unknown_ENGRAMD_VLLM_value_is_refused():
    result = plugin_load({"ENGRAMD_VLLM": "yes"})
    assert result.returncode != 0
    assert "IntegrationError: ENGRAMD_VLLM='yes': set it to 1" in result.stderr
