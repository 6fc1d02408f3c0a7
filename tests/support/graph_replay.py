"""Replaying a captured lookup on new ids, as an engine's decode step does (the GPU tests' helper)."""
from __future__ import annotations

import numpy as np
import torch


def replay_with(graph: "torch.cuda.CUDAGraph", static_ids: torch.Tensor, ids: np.ndarray) -> None:
    """Write ``ids`` into the graph's captured input buffer, replay it, and wait until it is done."""
    static_ids.copy_(torch.from_numpy(ids))
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
