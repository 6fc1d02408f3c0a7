"""Stand-in for the vllm.distributed pieces the Engram code uses (vLLM 0.33.0, 0.34.0), over real gloo groups.

Ranks are numbered DP-major (rank = dp_rank * tp_size + tp_rank), as vLLM lays out one engine's
ranks; the TP group holds one replica's ranks, the Engram DP group ("edp") the ranks with the same
TP rank in every replica of the node (None with one replica, as in vLLM).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class GroupCoordinator:
    """vLLM's GroupCoordinator as the Engram code uses it: ranks, its rank, a gloo cpu_group."""

    def __init__(self, ranks: list[int], cpu_group) -> None:
        self.ranks = ranks
        self.cpu_group = cpu_group
        self.world_size = len(ranks)
        self.rank_in_group = ranks.index(dist.get_rank())

    def broadcast_object(self, obj=None, src: int = 0):
        holder = [obj]
        dist.broadcast_object_list(holder, src=self.ranks[src], group=self.cpu_group)
        return holder[0]


_TP: GroupCoordinator | None = None
_EDP: GroupCoordinator | None = None


def init_groups(tp_size: int, dp_size: int) -> None:
    """Every rank creates every group, in one order (torch.distributed.new_group is collective)."""
    global _TP, _EDP
    rank = dist.get_rank()
    for dp_rank in range(dp_size):
        ranks = [dp_rank * tp_size + tp_rank for tp_rank in range(tp_size)]
        group = dist.new_group(ranks, backend="gloo")
        if rank in ranks:
            _TP = GroupCoordinator(ranks, group)
    for tp_rank in range(tp_size):
        ranks = [dp_rank * tp_size + tp_rank for dp_rank in range(dp_size)]
        group = dist.new_group(ranks, backend="gloo")
        if rank in ranks and dp_size > 1:
            _EDP = GroupCoordinator(ranks, group)


def get_tensor_model_parallel_rank() -> int:
    return _TP.rank_in_group


def get_tensor_model_parallel_world_size() -> int:
    return _TP.world_size


def get_engram_dp_group() -> GroupCoordinator | None:
    return _EDP


def get_engram_dp_size() -> int:
    return _EDP.world_size if _EDP is not None else 1


def tensor_model_parallel_all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """vLLM's TP all-gather (NCCL there); gloo here, through host memory."""
    if _TP.world_size == 1:
        return tensor
    host = tensor.detach().cpu().contiguous()
    parts = [torch.empty_like(host) for _ in range(_TP.world_size)]
    dist.all_gather(parts, host, group=_TP.cpu_group)
    return torch.cat(parts, dim=dim).to(tensor.device)
