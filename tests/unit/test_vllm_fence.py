"""The vLLM plugin's fence: it passes vLLM 0.33.0's and 0.34.0's surfaces and refuses any other, naming what differs.

The modules here are built in the test, with each release's signatures and calls (the real
releases pass the same fences: scripts/check_engines.py on their wheels); each test changes one
thing and hands the modules to ``check_vllm`` as vLLM's imports (and the decode prefetch as
the installed source text it reads).
"""
from __future__ import annotations

import logging
import types

import pytest

from engram_client import IntegrationError
from engram_client.integrations.vllm import fence
from engram_client.integrations.vllm.fences import DECODE_PREFETCH_MODULE, ENGRAM_MODULE, FENCES
from engram_client.integrations.vllm.patches import SHM_CHECKS

# The releases' names, parameters and calls (the bodies only reference what vLLM's reference).
ENGRAM = """
import functools

DEAD_ID = -1


def eager_break_during_capture(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class DPSharedEngramStorage:
    def __init__(self, num_rows: int, dim: int, block_size: int, group: object) -> None:
        HOST_TABLE
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


class NgramHashState:
    def dummy_hashes(self, input_ids):
        return input_ids.new_full(input_ids.shape, DEAD_ID)


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


def _shm_shortfall(num_bytes: int) -> str | None:
    return check_shm_free_space(num_bytes)


def can_share_engram_tables(layout, block_size: int = 32) -> bool:
    return ROOM_CHECK(0) is None
"""
RELEASES = {"0.33.0": {"HOST_TABLE": "pass", "ROOM_CHECK": "check_shm_free_space"},
            "0.34.0": {"HOST_TABLE": "engram_host_table.share_host_table(0, group)", "ROOM_CHECK": "_shm_shortfall"}}
DECODE_PREFETCH = """
def prefetchable(engram) -> bool:
    return engram._prefetch_stream is not None and engram._prefetch_done is not None


class EngramPrefetch:
    def start(self, num_tokens: int) -> None:
        self.stream.wait_event(self.engram._prefetch_done)
        return self.engram.staged_rows[:num_tokens]
"""


def module(name: str, source: str) -> types.ModuleType:
    built = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), built.__dict__)
    return built


class Release:
    """One release's modules: imported ones for the live check, the decode prefetch's source text."""

    def __init__(self, version: str, *replacements: tuple[str, str], decode: str | None = DECODE_PREFETCH):
        source = ENGRAM
        for key, value in RELEASES[version].items():
            source = source.replace(key, value)
        for old, new in replacements:
            assert old in source, old
            source = source.replace(old, new)
        config = types.ModuleType("vllm.config")
        config.get_current_vllm_config_or_none = lambda: None
        self.modules = {ENGRAM_MODULE: module(ENGRAM_MODULE, source), "vllm.config": config}
        self.decode = decode

    def import_module(self, name: str) -> types.ModuleType:
        if name == DECODE_PREFETCH_MODULE:
            raise AssertionError("the decode prefetch is read, never imported, at plugin load")
        if name not in self.modules:
            raise ImportError(f"No module named {name!r}")
        return self.modules[name]

    def read_source(self, name: str) -> str | None:
        assert name == DECODE_PREFETCH_MODULE, name  # only it is read from source
        return self.decode


def check(version: str, release: Release):
    return fence.check_vllm(version, release.import_module, release.read_source)


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_each_checked_release_passes_its_own_fence_annotations_and_decorators_aside(version):
    assert check(version, Release(version)).version == version


def test_the_checked_versions_are_the_fences_and_each_has_its_room_check_replaced():
    assert fence.CHECKED_VERSIONS == tuple(FENCES) == ("0.33.0", "0.34.0")
    assert SHM_CHECKS.keys() == FENCES.keys()


@pytest.mark.parametrize("version", ["0.33.1", "0.35.0", "0.32.2", "dev"])
def test_another_vllm_version_is_refused_naming_the_checked_ones_and_the_pin(version):
    with pytest.raises(IntegrationError, match=rf"run against vllm 0\.33\.0, 0\.34\.0 only; this is vllm {version}\. "
                                               r"Install one of those \(pip install 'vllm==0\.34\.0', or pip install "
                                               r"'engramd\[vllm\]'.*\(unset ENGRAMD_VLLM\)$"):
        check(version, Release("0.34.0"))


def test_a_release_is_held_to_its_own_fence_not_the_other_ones():
    # 0.33.0's room check under 0.34.0's version: the plugin would replace a name nothing calls.
    with pytest.raises(IntegrationError, match="can_share_engram_tables no longer uses _shm_shortfall"):
        check("0.34.0", Release("0.33.0"))


def test_a_changed_signature_is_refused_naming_the_method_and_both_signatures():
    changed = ("def _start_prefetch(self, hash_ids, rows)", "def _start_prefetch(self, hash_ids, rows, stream=None)")
    with pytest.raises(IntegrationError) as raised:
        check("0.34.0", Release("0.34.0", changed))
    message = str(raised.value)
    assert message.startswith("engramd's vllm integration cannot patch vllm 0.34.0: "
                              "vllm.models.deepseek_v41.common.engram: Engram._start_prefetch is "
                              "(self, hash_ids, rows, stream=None), expected (self, hash_ids, rows)")
    assert message.endswith("Unset ENGRAMD_VLLM to run vLLM without engramd")


def test_a_storage_no_longer_built_through_the_patched_name_is_refused():
    # Built some other way: replacing the module's DPSharedEngramStorage would change nothing.
    elsewhere = ("storage = DPSharedEngramStorage(0, 0, 0, None)\n        return storage.load_weight", "return None")
    with pytest.raises(IntegrationError, match="ParallelEngramEmbedding._allocate_weights no longer uses "
                                               "DPSharedEngramStorage, load_weight"):
        check("0.33.0", Release("0.33.0", elsewhere))


def test_an_embedding_reaching_the_host_numa_table_itself_is_refused():
    # Replacing the storage would then no longer bypass vLLM's cuMem table.
    direct = ("storage = DPSharedEngramStorage(0, 0, 0, None)",
              "storage = DPSharedEngramStorage(0, 0, 0, engram_host_table.share_host_table(0, None))")
    with pytest.raises(IntegrationError, match="ParallelEngramEmbedding._allocate_weights now uses share_host_table"):
        check("0.34.0", Release("0.34.0", direct))


def test_a_decode_chain_that_no_longer_waits_for_the_prefetch_event_is_refused():
    unordered = DECODE_PREFETCH.replace("self.stream.wait_event(self.engram._prefetch_done)\n", "")
    with pytest.raises(IntegrationError, match=r"EngramPrefetch\.start no longer uses _prefetch_done, wait_event"):
        check("0.34.0", Release("0.34.0", decode=unordered))


def test_a_vllm_without_its_specialized_decode_is_served_and_the_log_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="engram_client.integrations.vllm"):
        check("0.34.0", Release("0.34.0", decode=None))
    assert ("vLLM 0.34.0 has no specialized decode here (vllm/models/deepseek_v41/nvidia/specialized_decode/engram/"
            "prefetch.py is missing): its Engram WKV chain does not run") in caplog.text


def test_a_missing_name_of_another_vllm_module_is_refused():
    release = Release("0.33.0")
    release.modules["vllm.config"] = types.ModuleType("vllm.config")
    with pytest.raises(IntegrationError, match=r"vllm\.config: get_current_vllm_config_or_none is missing"):
        check("0.33.0", release)

