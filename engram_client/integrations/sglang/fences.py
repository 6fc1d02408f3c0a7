"""The SGLang releases the plugin was run against, each as one Fence (engine_fence.py): data only.

Imported by the plugin before it registers its hooks (checked live) and by
scripts/check_engines.py (checked on a wheel's sources); so it imports neither SGLang nor torch.
What each part holds up:

- ``EngramEmbedding``'s three replaced methods keep their parameters, and the paths that
  call them still do (``forward`` -> ``_lookup`` / ``_dp_sharded_lookup`` -> ``_owned_rows``,
  then SGLang's TP all-reduce; ``__init__`` hangs ``_load_rows`` on the parameters as
  their ``weight_loader``; the model's ``load_weights`` calls ``finish_load`` on every rank);
- ``shard_range`` splits rows on whole hash columns, which is what each rank registers;
- SGLang's scales cover 32 values each, as engramd's rows do;
- the host-table and staging knobs are still read where the plugin says they change nothing;
- the hook registry still applies a REPLACE by assignment (``_wrap_fn``, ``setattr``) and
  ``load_plugins`` still runs the ``sglang.srt.plugins`` group.
"""
from __future__ import annotations

from engram_client.integrations.engine_fence import Fence

ENGRAM_MODULE = "sglang.srt.layers.engram"
STAGING_MODULE = "sglang.srt.layers.engram_staging"
MODEL_MODULE = "sglang.srt.models.deepseek_v4"
PLUGINS_MODULE = "sglang.srt.plugins"
HOOKS_MODULE = "sglang.srt.plugins.hook_registry"
ENVIRON_MODULE = "sglang.srt.environ"
QUANT_MODULE = "sglang.kernels.ops.quantization.fp4_fake_quant"

FENCES = {
    "0.5.23": Fence(
        engine="sglang", version="0.5.23",
        signatures={
            ENGRAM_MODULE: {
                "EngramEmbedding.__init__": "(self, num_embeddings, dim, layer_id, column_bounds)",
                "EngramEmbedding._owned_rows": "(self, indices)",
                "EngramEmbedding._load_rows": "(self, param, loaded_weight)",
                "EngramEmbedding.finish_load": "(self, label)",
                "EngramEmbedding.new_rows": "(self, indices)",
                "EngramEmbedding.forward": "(self, indices, forward_batch=None, *, cp_all_tokens=False)",
                "Engram.__init__": "(self, config, layer_id, layout, quant_config=None, prefix='', *, "
                                   "image_token_id=None)",
                "shard_range": "(num_embeddings, column_bounds, tp_rank, tp_size)",
                "get_parallel": "()",
                "get_model": "()",
            },
            HOOKS_MODULE: {"_wrap_fn": "(original_fn, hook, hook_type)"},
            ENVIRON_MODULE: {"EnvField.get": "(self)", "EnvField.is_set": "(self)"},
        },
        calls={
            ENGRAM_MODULE: {
                "EngramEmbedding.__init__": ("shard_range", "get_parallel", "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE",
                                             "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS", "_load_rows", "weight_loader"),
                "EngramEmbedding._init_host_table": ("SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT",),
                "EngramEmbedding.forward": ("peer", "_shared", "_lookup", "_dp_sharded_lookup"),
                "EngramEmbedding._lookup": ("_owned_rows", "_reduce_owned_rows"),
                "EngramEmbedding._dp_sharded_lookup": ("_owned_rows",),
                "EngramEmbedding.finish_load": ("peer", "host_table"),
                "Engram.__init__": ("EngramEmbedding", "column_bounds"),
                "Engram.embed_rows": ("engram_staged_rows", "dequant_staged"),
            },
            STAGING_MODULE: {
                "EngramRowStager.from_model": ("SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING", "shared_host_table_without_ats"),
            },
            MODEL_MODULE: {"DeepseekV4ForCausalLM.load_weights": ("finish_load", "weight_loader")},
            PLUGINS_MODULE: {"load_plugins": ("load_plugins_by_group", "GENERAL_PLUGINS_GROUP", "apply_hooks")},
            HOOKS_MODULE: {"_wrap_fn": ("REPLACE",), "HookRegistry._apply_target": ("setattr", "_wrap_fn")},
        },
        names={
            ENGRAM_MODULE: ("EngramEmbedding", "Engram", "envs"),
            HOOKS_MODULE: ("HookRegistry", "HookType"),
            ENVIRON_MODULE: ("envs",),
        },
        constants={PLUGINS_MODULE: {"GENERAL_PLUGINS_GROUP": "sglang.srt.plugins"},
                   QUANT_MODULE: {"FP8_BLOCK_SIZE": 32}},  # values per scale byte, engramd's QUANT_BLOCK
    ),
}
