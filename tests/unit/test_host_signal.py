"""How the host path chooses its signalling per device (host_signal.py), and says so once.

The suite's machines have no GPU, so the device's answer to the live round trip is stood in for
(``_probe``); tests/gpu/test_host_signal_gpu.py asks a real one."""
from __future__ import annotations

import logging

import pytest
import torch

from engram_client.lookup.host import host_signal
from engram_client.core.errors import ConfigError, CudaRegistrationError

UNSUPPORTED = {"supported": False, "reason": "the stream did not answer a CPU-written word within 1 s",
               "round_trip_us": -1.0}


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(host_signal, "_chosen", {})
    monkeypatch.delenv(host_signal.ENV, raising=False)
    return monkeypatch


def test_a_bad_request_names_the_variable_and_its_choices(fresh):
    fresh.setenv(host_signal.ENV, "sometimes")
    with pytest.raises(ConfigError, match=r"ENGRAM_HOST_SIGNAL='sometimes': use one of auto, stream-memops, "
                                          r"host-functions"):
        host_signal.signalling_for(torch.device("cuda", 0))


def test_forced_host_functions_never_ask_the_device_and_are_said_once(fresh, caplog):
    fresh.setenv(host_signal.ENV, host_signal.HOST_FUNCTIONS)
    fresh.setattr(host_signal, "_probe", lambda device: pytest.fail("the device was asked"))
    with caplog.at_level(logging.INFO, logger="engram_client"):
        choices = [host_signal.signalling_for(torch.device("cuda", 0)) for _ in range(3)]
    assert {c.mode for c in choices} == {host_signal.HOST_FUNCTIONS}
    assert choices[0].as_dict()["signalling"] == "host-functions" and "asks for them" in choices[0].reason
    assert len([r for r in caplog.records if "host functions signal" in r.getMessage()]) == 1


def test_a_device_that_fails_the_round_trip_falls_back_with_one_warning(fresh, caplog):
    asked = []
    fresh.setattr(host_signal, "_probe", lambda device: asked.append(device) or UNSUPPORTED)
    with caplog.at_level(logging.INFO, logger="engram_client"):
        for _ in range(2):
            choice = host_signal.signalling_for(torch.device("cuda", 1))
    assert choice.mode == host_signal.HOST_FUNCTIONS and UNSUPPORTED["reason"] in choice.reason
    assert choice.as_dict()["device_support"] == UNSUPPORTED and len(asked) == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "falls back to host functions" in warnings[0].getMessage()
    fresh.setenv(host_signal.ENV, host_signal.STREAM_MEMOPS)  # asked for, and impossible: refused
    with pytest.raises(CudaRegistrationError, match="cannot signal with stream memory operations"):
        host_signal.signalling_for(torch.device("cuda", 1))


def test_a_device_that_answers_gets_stream_memory_operations(fresh):
    fresh.setattr(host_signal, "_probe", lambda device: {"supported": True, "reason": "", "round_trip_us": 4.4})
    choice = host_signal.signalling_for(torch.device("cuda", 0))
    assert choice.mode == host_signal.STREAM_MEMOPS and "4.4 us" in choice.reason
