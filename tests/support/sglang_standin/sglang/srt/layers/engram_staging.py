"""Stand-in for sglang/srt/layers/engram_staging.py (SGLang 0.5.23): only whether the scheduler stages rows.

SGLang stages (16 gather threads, a copy stream) only when SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING
is set and every Engram table is a shared host table on a GPU without ATS; the staging itself
is not replayed (``from_model`` raises where SGLang would build a stager).
"""
from sglang.srt.environ import envs
from sglang.srt.layers.engram import Engram


class EngramRowStager:
    @classmethod
    def from_model(cls, model, hasher, device):
        if not envs.SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING.get():
            return None
        embeds = [m.embed for m in model.modules() if isinstance(m, Engram)]
        if not embeds or not all(e.shared_host_table_without_ats for e in embeds):
            return None
        raise RuntimeError("stand-in: the scheduler's staging is not replayed")
