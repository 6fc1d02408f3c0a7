"""Stand-in for the Engram steps of sglang/srt/models/deepseek_v4.py (SGLang 0.5.23).

Replayed in SGLang's order:

- construction: ``EngramLayout.from_config(config)`` and one ``Engram`` per layer of
  ``engram_layer_ids`` (``DeepseekV4Model.__init__`` builds them in its decoder layers);
- ``DeepseekV4ForCausalLM.load_weights``: every tensor of the checkpoint's safetensors files,
  renamed as SGLang does (``layers.`` -> ``model.layers.``; an Engram table's ``.scale`` keeps
  its name), each parameter's ``weight_loader(param, tensor)`` submitted to a thread pool for
  CPU tensors (``maybe_executor_submit``), the futures collected, then ``finish_load(label)``
  of every Engram layer in layer order;
- ``engram_rows``: what each decoder layer's ``Engram.forward`` looks up,
  ``embed_rows(hash_ids[:, layer_hash_index], forward_batch, cp_all_tokens)``.
"""
import concurrent.futures
import glob
import os

from safetensors import safe_open
from torch import nn

from sglang.srt.layers.engram import Engram, EngramLayout


def safetensors_weights(checkpoint):
    for path in sorted(glob.glob(os.path.join(checkpoint, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


class DeepseekV4ForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.engram_layout = EngramLayout.from_config(config)
        self.engrams = nn.ModuleDict({str(layer): Engram(config, layer, self.engram_layout)
                                      for layer in self.engram_layout.layer_ids})

    def load_weights(self, weights, is_nextn=False):
        params_dict = {name.replace("engrams.", "model.layers.").replace(".embed.", ".engram.embed."): param
                       for name, param in self.named_parameters()}
        futures = []
        with concurrent.futures.ThreadPoolExecutor() as executor:
            for name, loaded_weight in weights:
                if name.startswith("layers."):
                    name = "model." + name
                if name not in params_dict:
                    continue  # the rest of the model is not replayed
                param = params_dict[name]
                weight_loader = param.weight_loader
                if loaded_weight.device.type == "cpu":
                    futures.append(executor.submit(weight_loader, param, loaded_weight))
                else:
                    weight_loader(param, loaded_weight)
            for future in concurrent.futures.as_completed(futures):
                future.result()
        for layer, engram in self.engrams.items():
            engram.embed.finish_load(label=f"layer {layer}")

    def engram_rows(self, hash_ids, forward_batch=None):
        return {layer: engram.embed_rows(hash_ids[:, engram.layer_hash_index], forward_batch, False)
                for layer, engram in self.engrams.items()}
