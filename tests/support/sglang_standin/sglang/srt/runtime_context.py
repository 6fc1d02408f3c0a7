"""Stand-in for sglang/srt/runtime_context.py (SGLang 0.5.23): the published parallel and model context.

SGLang publishes them before it builds the model; the stand-in's rank program does (``publish``).
``tp_group`` is a GroupCoordinator over a real gloo group: ``world_size``, ``rank_in_group``,
``cpu_group``, and the all-reduce SGLang's lookup ends with.
"""
from types import SimpleNamespace

import torch.distributed as dist

_PARALLEL = None
_MODEL = None


class GroupCoordinator:
    def __init__(self, ranks, cpu_group):
        self.ranks, self.cpu_group, self.world_size = ranks, cpu_group, len(ranks)
        self.rank_in_group = ranks.index(dist.get_rank())

    def all_reduce(self, tensor):
        """SGLang's TP all-reduce (NCCL there); gloo here, through host memory in float32 (exact:
        every row is non-zero on at most one rank)."""
        if self.world_size == 1:
            return tensor
        host = tensor.detach().float().cpu()
        dist.all_reduce(host, group=self.cpu_group)
        return host.to(tensor.dtype).to(tensor.device)


def publish(tp_rank, tp_size, tp_group, model_path):
    global _PARALLEL, _MODEL
    _PARALLEL = SimpleNamespace(tp_rank=tp_rank, tp_size=tp_size, tp_group=tp_group, attn_dp_size=1,
                                attn_cp_size=1)
    _MODEL = SimpleNamespace(model_path=model_path)


def get_parallel():
    return _PARALLEL


def get_model():
    if _MODEL is None:
        raise ValueError("no runtime context published")
    return _MODEL
