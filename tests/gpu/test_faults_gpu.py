"""GPU ranks through a daemon's kill -9: their registered mappings outlive the daemon."""
from __future__ import annotations

import pytest
import torch

from ranks_under_kill import run_ranks_through_a_kill

pytestmark = pytest.mark.gpu


def test_gpu_ranks_keep_exact_lookups_when_the_daemon_is_killed(daemon_factory):
    # Every GPU the machine has gets a rank, plus a second rank on the first GPU and one on the
    # CPU: the daemon's death must not disturb pinned (cudaHostRegister) mappings or plain ones.
    devices = [f"cuda:{index}" for index in range(torch.cuda.device_count())] + ["cuda:0", "cpu"]
    results = run_ranks_through_a_kill(daemon_factory("--lease-seconds", "1.5"), devices)
    assert len(results) == len(devices)
