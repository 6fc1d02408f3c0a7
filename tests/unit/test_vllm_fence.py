"""The vLLM plugin's fence: it passes vLLM 0.33.0's surface and refuses any other, naming what differs.

The modules here are built in the test, with vLLM 0.33.0's signatures and calls (the real
module passes the same fence: scripts/check_vllm_plugin.sh); each test changes one thing.
"""
from __future__ import annotations

import types

import pytest

from engram_client import IntegrationError
from engram_client.integrations.vllm import fence


# vLLM 0.33.0's names, parameters and calls (the bodies only reference what vLLM's reference).
SOURCE = """
import functools


def eager_break_during_capture(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class DPSharedEngramStorage:
    def __init__(self, num_rows: int, dim: int, block_size: int, group: object) -> None: ...
    def load_weight(self, param, loaded_weight) -> None: ...
    def get_views(self, weight, scales): ...


class ParallelEngramEmbedding:
    def __init__(self, num_embeddings: int, dim: int, head_sizes: tuple, block_size: int = 32,
                 cpu_offload: bool = False, dp_shared_memory: bool = False, use_thp: bool = False) -> None:
        self.head_start = self.part_n_hash_cols = self.vocab_start_idx = self.part_num_embeddings = 0
        self._allocate_weights()

    def _allocate_weights(self):
        storage = DPSharedEngramStorage(0, 0, 0, None)
        return storage.load_weight

    def _storage(self):
        return self._shared_memory.get_views(None, None)

    def lookup(self, indices, out, background: bool = False) -> None: ...


class Engram:
    def prepare_embeddings(self, hash_ids) -> None:
        rows = self.staged_rows
        self.embed_tokens.lookup(hash_ids, rows) if rows is None else self._start_prefetch(hash_ids, rows)

    @eager_break_during_capture
    def _start_prefetch(self, hash_ids, rows) -> None: ...

    @eager_break_during_capture
    def _finish_prefetch(self, event) -> None: ...

    def _ready_rows(self, num_tokens: int):
        self._finish_prefetch(None)
        return self.staged_rows


def check_shm_free_space(required_bytes: int, shm_path: str = "/dev/shm", *,
                         allocation_name: str = "shared-memory allocation") -> None: ...


def can_share_engram_tables(layout, block_size: int = 32) -> bool:
    return check_shm_free_space(0) is None
"""


def engram_module(*replacements: tuple[str, str]) -> types.ModuleType:
    """SOURCE as a module, each (old, new) text replaced first."""
    source = SOURCE
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    module = types.ModuleType(fence.ENGRAM_MODULE)
    exec(compile(source, "<vllm 0.33.0 engram surface>", "exec"), module.__dict__)
    return module


def test_vllm_0_33_0s_surface_passes_annotations_and_decorators_aside():
    fence.check_version("0.33.0")
    fence.check_surface(engram_module(), "0.33.0")


@pytest.mark.parametrize("version", ["0.33.1", "0.34.0", "0.32.2", "dev"])
def test_another_vllm_version_is_refused_naming_both(version):
    with pytest.raises(IntegrationError, match=rf"checked against vLLM 0\.33\.0 only; this is vLLM {version}\. "
                                               r"Install vllm==0\.33\.0"):
        fence.check_version(version)


def test_a_changed_signature_is_refused_naming_the_method_and_both_signatures():
    changed = ("def _start_prefetch(self, hash_ids, rows)", "def _start_prefetch(self, hash_ids, rows, stream=None)")
    with pytest.raises(IntegrationError) as raised:
        fence.check_surface(engram_module(changed), "0.33.1")
    message = str(raised.value)
    assert "cannot patch vLLM 0.33.1's vllm.models.deepseek_v41.common.engram" in message
    assert "Engram._start_prefetch is (self, hash_ids, rows, stream=None), expected (self, hash_ids, rows)" in message
    assert "unset ENGRAMD_VLLM" in message


def test_a_storage_no_longer_built_through_the_patched_name_is_refused():
    # Built some other way: replacing the module's DPSharedEngramStorage would change nothing.
    elsewhere = ("storage = DPSharedEngramStorage(0, 0, 0, None)\n        return storage.load_weight", "return None")
    with pytest.raises(IntegrationError, match="ParallelEngramEmbedding._allocate_weights no longer uses "
                                               "DPSharedEngramStorage, load_weight"):
        fence.check_surface(engram_module(elsewhere), "0.33.0")


def test_a_missing_name_is_refused():
    module = engram_module()
    del module.can_share_engram_tables
    with pytest.raises(IntegrationError, match="can_share_engram_tables is missing"):
        fence.check_surface(module, "0.33.0")


def test_a_missing_name_of_another_vllm_module_is_refused():
    config = types.ModuleType("vllm.config")
    with pytest.raises(IntegrationError, match=r"cannot patch vLLM 0\.33\.0: vllm\.config\.get_current_vllm_config_or_none "
                                               "is missing"):
        fence.check_names({"vllm.config": config}, "0.33.0")
    config.get_current_vllm_config_or_none = lambda: None
    fence.check_names({"vllm.config": config}, "0.33.0")


def test_shape_keeps_names_kinds_and_defaults_only():
    def f(a: int, b: str = "x", *args, c: float = 1.0, **kwargs) -> None: ...

    def g(a, /, b, *, c): ...

    assert fence.shape(f) == "(a, b='x', *args, c=1.0, **kwargs)"
    assert fence.shape(g) == "(a, /, b, *, c)"
