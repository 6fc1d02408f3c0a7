"""benchmarks/engine/e2e.py's busy summary: the measures issue 35 judges (the decode step's median
and p90 alone and beside busy neighbours, a lone lookup's p90, the neighbours' own rows/s, over their
whole run and within the rank's decode windows), from a run's results as the benchmark records them."""
from __future__ import annotations

import json

import pytest

from benchmarks.busy_neighbours import counted_within, rows_per_s_within, stop_neighbours
from benchmarks.engine.e2e_summary import busy_summary


def test_the_summary_puts_the_step_beside_neighbours_against_the_step_alone():
    model = {"decode": {"host": {"step_median_ms": 4.0, "step_p90_ms": 4.2}},
             "busy": {"neighbours": 3,
                      "decode": {"host+busy": {"step_median_ms": 4.4, "step_p90_ms": 10.0}},
                      "lookup_alone": {"p90_ms": 0.3}, "lookup_busy": {"p90_ms": 3.0},
                      "neighbour_reports": [{"m_rows_per_s": 10.0}, {"m_rows_per_s": 11.5}, {"m_rows_per_s": 9.0}]}}
    summary = busy_summary(model)
    assert summary["median_x"] == 1.1 and summary["p90_x_median_alone"] == 2.5 and summary["lookup_p90_x"] == 10.0
    assert summary["step_busy_p90_ms"] == 10.0 and summary["step_alone_p90_ms"] == 4.2
    assert summary["neighbours_m_rows_per_s"] == 30.5 and summary["each_neighbour"] == [10.0, 11.5, 9.0]
    assert summary["neighbours_decoding_m_rows_per_s"] is None  # a run before decode windows were recorded


def test_a_call_counts_the_share_of_its_time_inside_the_windows():
    windows = [[10.0, 12.0], [20.0, 21.0]]  # 3 s in all
    spans = [[5.0, 6.0],      # before them: nothing
             [9.0, 11.0],     # across the first's start: half its rows
             [11.0, 11.5],    # inside: all of them
             [11.5, 20.5],    # the first's last 0.5 s, the gap, the second's first 0.5 s: 1/9
             [20.5, 20.5],    # no length, inside: all of them
             [20.5, 22.5],    # across the second's end: a quarter
             [25.0, 26.0], [30.0, 30.0]]  # after them, one of no length: nothing
    assert rows_per_s_within(spans, 900, windows) == pytest.approx((450 + 900 + 100 + 900 + 225) / 3)
    assert rows_per_s_within([[5.0, 6.0], [12.0, 20.0]], 900, windows) == 0.0  # between them counts nothing
    assert rows_per_s_within(spans, 900, []) is None and rows_per_s_within(spans, 900, [[4.0, 4.0]]) is None


def test_the_summary_counts_the_neighbours_rows_within_the_decode_windows_alone():
    reports = [{"m_rows_per_s": 0.9, "rows_per_call": 10**6, "spans": [[100.0, 100.5], [100.5, 101.5], [101.5, 102.5]]},
               {"m_rows_per_s": 0.5, "rows_per_call": 10**6, "spans": [[99.0, 103.0]]},
               {"m_rows_per_s": 0.0, "rows_per_call": 10**6, "spans": []}]
    model = {"decode": {"host": {"step_median_ms": 4.0, "step_p90_ms": 4.2}},
             "busy": {"neighbours": 3, "decode": {"host+busy": {"step_median_ms": 4.4, "step_p90_ms": 10.0}},
                      "lookup_alone": {"p90_ms": 0.3}, "lookup_busy": {"p90_ms": 3.0},
                      "neighbour_reports": counted_within(reports, [[100.0, 101.0], [102.0, 103.0]])}}
    assert all("spans" not in r for r in model["busy"]["neighbour_reports"])  # the figure is kept, not every call
    summary = busy_summary(model)
    # 2 M rows of the first (1 + 0.5 + 0.5) and 0.5 M of the second (2 s of its 4) in 2 s
    assert summary["neighbours_decoding_m_rows_per_s"] == 1.25 and summary["neighbours_m_rows_per_s"] == 1.4


class Ended:
    """A neighbour process that has printed ``out`` and exited."""
    pid, returncode = 4242, 0

    def __init__(self, out: str):
        self.out = out

    def communicate(self, _input, timeout):
        return self.out, None


def test_a_neighbours_report_is_its_last_line_and_one_without_it_is_refused():
    report = {"calls": 2, "m_rows_per_s": 7.86, "cores": 1.9, "caller_cores": 0.4, "rows_per_call": 393216,
              "spans": [[1.0, 1.05], [1.05, 1.1]]}
    [got] = stop_neighbours([Ended("ready\n" + json.dumps(report) + "\n")])
    assert got == report
    for out in ("ready\n", "ready\n12 3.1e7 1.9 0.4\n", "ready\n" + json.dumps({"calls": 2}) + "\n", ""):
        with pytest.raises(SystemExit, match="pid 4242, rc 0.* ended without its report"):
            stop_neighbours([Ended(out)])


def test_the_rules_table_puts_each_rule_beside_the_baseline_rule():
    from benchmarks.engine.busy_rules import RULES, table, with_baseline

    def summary(median_x: float, rows: float) -> dict:
        return {"step_alone_ms": 6.5, "step_busy_ms": 6.5 * median_x, "median_x": median_x, "p90_x_median_alone": 1.4,
                "lookup_p90_x": 5.7, "lookup_alone_p90_ms": 0.3, "lookup_busy_p90_ms": 1.71,
                "neighbours_m_rows_per_s": rows}

    summaries = with_baseline({"default": summary(1.005, 28.1), "decode-0": summary(1.134, 28.7)}, "decode-0")
    assert summaries["default"]["neighbours_x_baseline"] == 0.979 and summaries["decode-0"]["neighbours_x_baseline"] == 1.0
    assert summaries["default"]["neighbours_decoding_x_baseline"] is None  # summaries before decode windows
    lines = table(summaries, "decode-0").splitlines()
    assert len(lines) == 4 and lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == lines[3].count("|")
    assert lines[0].endswith("| neighbours M rows/s | ×decode-0 | while decoding, M rows/s | ×decode-0 |")
    assert "| median ×decode-0 alone |" in lines[0]
    assert lines[2].startswith("| default | `(none)` |") and lines[2].endswith("| 28.1 | 0.98x | — | — |")
    assert "| 1.005x | 1.400x | 1.005x | 5.7x | 5.70x |" in lines[2]  # against the baseline's own rank alone
    assert f"`{RULES['decode-0']}`" in lines[3] and lines[3].endswith("| 28.7 | 1.00x | — | — |")
    alone = with_baseline({"idle": summary(1.006, 34.5)}, "decode-0")  # the baseline did not run: no ratio
    assert alone["idle"]["neighbours_x_baseline"] is None and alone["idle"]["step_busy_x_baseline_alone"] is None
    assert table(alone, "decode-0").splitlines()[2].endswith("| 34.5 | — | — | — |")
    decoding = with_baseline({"default": {**summary(1.005, 28.1), "neighbours_decoding_m_rows_per_s": 20.0},
                              "decode-0": {**summary(1.134, 28.7), "neighbours_decoding_m_rows_per_s": 25.0},
                              "idle": summary(1.006, 34.5)}, "decode-0")
    assert decoding["default"]["neighbours_decoding_x_baseline"] == 0.8
    assert decoding["default"]["neighbours_x_baseline"] == 0.979  # the whole run's ratio kept beside it
    assert decoding["idle"]["neighbours_decoding_x_baseline"] is None  # its run recorded no windows
    lines = table(decoding, "decode-0").splitlines()
    assert len({line.count("|") for line in lines}) == 1
    assert lines[2].endswith("| 28.1 | 0.98x | 20.0 | 0.80x |") and lines[3].endswith("| 28.7 | 1.00x | 25.0 | 1.00x |")
    no_base = with_baseline({"default": {**summary(1.005, 28.1), "neighbours_decoding_m_rows_per_s": 20.0},
                             "decode-0": summary(1.134, 28.7)}, "decode-0")  # the baseline's run had none
    assert no_base["default"]["neighbours_decoding_x_baseline"] is None


def test_a_rule_whose_rank_asks_a_decode_path_says_so_and_is_run_with_it(monkeypatch, tmp_path):
    """gpu-decode's rank takes the UVA kernel for decode-size calls: the table names it, the run passes it to
    e2e (the command is captured, not run), and lone_rules, whose ranks cannot take it, refuses the rule."""
    import json
    import subprocess

    import pytest

    from benchmarks.engine import busy_rules
    from benchmarks.node import lone_rules

    seen = []

    def fake_run(command, **kwargs):
        seen.append(command)
        path = command[command.index("--json") + 1]
        with open(path, "w") as f:
            json.dump({"models": {"2048x16": {"busy_summary": {"step_alone_ms": 1.0}}}}, f)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(busy_rules.subprocess, "run", fake_run)
    args = type("Args", (), {"keep": None, "table_gib": 1.0, "decode_steps": 2, "rounds": 1, "busy_neighbours": 1})
    busy_rules.run_rule("gpu-decode", args, str(tmp_path))
    busy_rules.run_rule("decode-0", args, str(tmp_path))
    assert seen[0][seen[0].index("--decode-path") + 1] == "uva" and "--decode-path" not in seen[1]
    assert busy_rules.rule_words("gpu-decode") == "`--decode-cpus 0`, decode_path `uva`"
    with pytest.raises(SystemExit, match="gpu-decode set the ranks' decode path"):
        lone_rules.parse_rules("default,gpu-decode")


def test_a_baseline_outside_the_rules_is_refused_before_any_run(monkeypatch):
    import pytest

    from benchmarks.engine import busy_rules

    monkeypatch.setattr("sys.argv", ["busy_rules", "--rules", "default,decode-4", "--baseline", "decode-0"])
    monkeypatch.setattr(busy_rules, "run_rule", lambda *a: pytest.fail("a rule ran"))
    with pytest.raises(SystemExit, match="--baseline 'decode-0' is not among --rules"):
        busy_rules.main()


BURNER = """
import ctypes, sys, threading, time
def named(name):
    ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: the thread's comm
def burn():
    named("burner")
    while True:
        pass
named("sleeper")
threading.Thread(target=burn, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def test_the_cores_within_spans_are_counted_by_thread_name_in_another_process():
    """A real process with a spinning thread and a sleeping one: within the spans the spinning thread's
    name has the CPU, the sleeping one's none; outside them nothing is counted."""
    import subprocess
    import sys
    import time

    from benchmarks.busy_neighbours import CoresWithin

    proc = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        within = CoresWithin([proc.pid])
        assert within.cores() == {}  # no span yet
        for _ in range(2):
            within.begin()
            time.sleep(0.2)
            within.end()
            time.sleep(0.3)  # the burner spins on between the spans: not counted
        cores = within.cores()
        assert 0 < cores["burner"] <= 1.05 and "sleeper" not in cores  # one thread: a core at most
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_the_neighbours_cores_are_counted_around_the_host_paths_decode_runs_alone(monkeypatch):
    """measure() tells its CoresWithin when host+busy's decode runs begin and end, and around no other
    variant's run nor any prefill.  The CUDA graph replays and prefills cannot run here: Decode,
    prefill_ms and check_rows are stand-ins that log what ran."""
    import types

    from benchmarks.engine import e2e

    log = []

    class Decode:
        def __init__(self, model, source):
            self.source = source

        def run(self, steps):
            log.append(f"decode {self.source}")
            return [1.0] * steps, [0.0, 1.0]

    class Within:
        def begin(self):
            log.append("begin")

        def end(self):
            log.append("end")

    monkeypatch.setattr(e2e, "Decode", Decode)
    monkeypatch.setattr(e2e, "check_rows", lambda sources, hasher: None)
    monkeypatch.setattr(e2e, "prefill_ms", lambda model, source: log.append(f"prefill {source}") or 10.0)
    model = types.SimpleNamespace(hasher=None)
    args = types.SimpleNamespace(rounds=2, decode_steps=3)
    result = e2e.measure(model, {"hbm": "hbm", "host+busy": "host"}, args, "test", Within())
    runs = [entry for entry in log if not entry.startswith("prefill")]
    assert runs == ["decode hbm", "begin", "decode host", "end"] * 2
    assert result["decode"]["host+busy"]["windows"] == [[0.0, 1.0]] * 2
    log.clear()
    e2e.measure(model, {"hbm": "hbm", "host": "host"}, args, "test")  # alone: nothing to tell
    assert "begin" not in log
