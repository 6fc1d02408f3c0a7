"""A stand-in for SGLang 0.5.23, for engramd's tests: the few modules engramd's SGLang plugin touches.

This is NOT SGLang.  SGLang's Engram code runs on GPUs only (Triton gathers, CUDA host
registration) and SGLang is not installed where the tests run; so these modules replay SGLang
0.5.23's call sequence around the class the plugin hooks, with SGLang's module paths, names
and signatures (the plugin's fence checks them here as it does in SGLang), written from
reading SGLang 0.5.23's sources:

- ``sglang.srt.plugins`` and ``.hook_registry`` (srt/plugins/__init__.py, hook_registry.py):
  the ``sglang.srt.plugins`` entry points, ``SGLANG_PLUGINS``, each plugin's exception logged
  and ignored, then ``HookRegistry.apply_hooks`` (REPLACE and AROUND on methods);
- ``sglang.srt.layers.engram`` (srt/layers/engram.py): ``EngramLayout``'s primes,
  ``shard_range``, ``EngramEmbedding`` (SGLang's device-table path, its forward through
  ``_lookup`` -> ``_owned_rows`` -> the TP all-reduce), ``Engram.embed_rows``;
- ``sglang.srt.layers.engram_staging`` (``EngramRowStager.from_model``'s decision only);
- ``sglang.srt.models.deepseek_v4`` (``DeepseekV4ForCausalLM``: the Engram layers, ``load_weights``
  from real safetensors files with loaders on a thread pool, then ``finish_load`` per layer);
- ``sglang.srt.environ``, ``sglang.srt.runtime_context``, the FP8 block size.

What it does not replay, because the plugin replaces it: SGLang's host table, peer shards and
Triton gather (they raise here), nor anything else of the model (hashing, wkv, gate).  The
version is the one of ``sglang-0.5.23.dist-info`` beside this package.
"""
