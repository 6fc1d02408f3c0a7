"""Which served layer and rows a vLLM Engram embedding gets, checked against what vLLM computed.

vLLM derives each layer's head sizes from the model's config.json; engramd derives them from
the checkpoint it serves.  The layer is the served one with exactly vLLM's head sizes (sizes
are distinct primes, so at most one matches); its head width, quantization block and the rank's
row range must then be vLLM's too.  Any difference is a checkpoint vLLM and engramd do not
share, and is refused naming both.
"""
from __future__ import annotations

from engram_client import IntegrationError
from engram_client.core.layout import QUANT_BLOCK
from engram_client.integrations.rank.served_layer import ServedLayer, heads_in_words

from .building import Building
from .head_split import rank_client


def vllm_model() -> str:
    """The model vLLM is loading (its ``--model``), for messages; vLLM sets its config around model
    construction, and a caller that builds an embedding outside one gets "(no current vLLM config)"."""
    from vllm.config import get_current_vllm_config_or_none

    model_config = getattr(get_current_vllm_config_or_none(), "model_config", None)
    return f"vLLM's model {getattr(model_config, 'model', None) or '(no current vLLM config)'}"


def serve_layer(building: Building, num_rows: int, dim: int, block_size: int) -> ServedLayer:
    embedding, head_sizes = building.embedding, building.head_sizes
    attached = rank_client(embedding.head_start, embedding.part_n_hash_cols)
    client, model = attached.client, vllm_model()
    layer = next((layer for layer in client.layers if client.table(layer).head_sizes == head_sizes), None)
    if layer is None:
        served = "; ".join(f"layer {layer}: {heads_in_words(client.table(layer).head_sizes)}"
                           for layer in client.layers)
        raise IntegrationError(f"{model} has an Engram layer of {heads_in_words(head_sizes)}, head_dim {dim}, "
                               f"which {attached.describe_table()} does not hold ({served}): serve the "
                               "checkpoint vLLM loads with engramd, or load engramd's checkpoint in vLLM")
    table = client.table(layer)
    where = f"layer {layer} of {attached.describe_table()}"
    if (dim, block_size) != (table.head_dim, QUANT_BLOCK):
        raise IntegrationError(f"{model}: layer {layer} has head_dim {dim} with scales per {block_size} values; "
                               f"{where} has head_dim {table.head_dim} with scales per {QUANT_BLOCK}")
    if embedding.num_embeddings != table.num_rows:
        raise IntegrationError(f"{model}: layer {layer} has {embedding.num_embeddings} rows "
                               f"(engram_num_embeddings); {where} has {table.num_rows}")
    wanted = (embedding.vocab_start_idx, embedding.vocab_end_idx)
    if table.row_range != wanted or num_rows != wanted[1] - wanted[0]:
        raise IntegrationError(f"vLLM gives this rank rows {list(wanted)} ({num_rows} rows) of layer {layer}; "
                               f"engramd registered {list(table.row_range)} for heads from {attached.head_start}")
    local_heads = min(embedding.part_n_hash_cols, len(head_sizes) - embedding.head_start)
    return ServedLayer(attached, table, embedding.head_start, local_heads, model)
