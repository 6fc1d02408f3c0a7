"""A load's thread and the reload that follows it: once its generation has ended (status says
failed or ready) the thread only cleans up, so a reload waits for it briefly instead of being
refused as "in progress"; a load still running is refused at once.

The job here is a stand-in for LoadJob (a real checkpoint load is the integration tests' part:
tests/integration/test_checkpoint_links.py reloads right after a failed one): its run sets the
generation's state as LoadJob.run does, then holds the thread as its clean-up would.
"""
from __future__ import annotations

import threading

from engram_client.core.protocol import FAILED, LOADING
from engramd.daemon.generation import Generation
from engramd.daemon.load_job import LOAD_WIND_DOWN_S, LoadThread


class EndingJob:
    def __init__(self, end_state: str, hold: threading.Event):
        self.generation, self.end_state, self.hold, self.ended = Generation(2, None), end_state, hold, threading.Event()

    def run(self) -> None:
        self.generation.state = self.end_state
        self.ended.set()
        self.hold.wait(30)  # the clean-up, until the test lets it end


def test_a_reload_waits_for_a_failed_loads_clean_up_and_is_not_refused():
    hold = threading.Event()
    job = EndingJob(FAILED, hold)
    thread = LoadThread(job)
    thread.start()
    assert job.ended.wait(10) and thread.is_alive()
    threading.Timer(0.2, hold.set).start()  # the clean-up ends well inside LOAD_WIND_DOWN_S
    assert not thread.busy()  # waited for it, then found it gone


def test_a_load_still_running_is_busy_without_a_wait_and_a_stuck_clean_up_still_refuses():
    hold = threading.Event()
    running = EndingJob(LOADING, hold)
    thread = LoadThread(running)
    thread.start()
    try:
        assert running.ended.wait(10)
        assert thread.busy()  # loading: refused (no join: the load may run for minutes)
        stuck = EndingJob(FAILED, hold)
        stuck_thread = LoadThread(stuck)
        stuck_thread.start()
        assert stuck.ended.wait(10)
        assert stuck_thread.busy()  # a clean-up longer than LOAD_WIND_DOWN_S: still refused, never a hang
    finally:
        hold.set()
