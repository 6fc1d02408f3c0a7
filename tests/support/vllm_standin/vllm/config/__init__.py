"""Stand-in for the vllm.config pieces the Engram code reads (vLLM 0.33.0, 0.34.0): EngramConfig and the current config.

0.34.0's EngramConfig adds ``disk_offload``, which only Qwen4Exp's tables read; not replayed.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace


@dataclass
class EngramConfig:
    cpu_offload: bool = True
    embedding_across_dp: bool = False
    dp_shared_memory: bool | None = None
    use_thp: bool = False


@dataclass
class ModelConfig:
    model: str
    hf_text_config: SimpleNamespace


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 8192


@dataclass
class VllmConfig:
    model_config: ModelConfig
    engram_config: EngramConfig = field(default_factory=EngramConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)


_current: VllmConfig | None = None


@contextmanager
def set_current_vllm_config(config: VllmConfig):
    global _current
    outer, _current = _current, config
    try:
        yield
    finally:
        _current = outer


def get_current_vllm_config_or_none() -> VllmConfig | None:
    return _current


def get_current_vllm_config() -> VllmConfig:
    if _current is None:
        raise RuntimeError("stand-in: no current vLLM config (model construction sets it)")
    return _current
