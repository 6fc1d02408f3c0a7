"""Synthetic checkpoints for tests and benchmarks (``engramd synth``): the V4.1-layout writer (which needs
torch and safetensors: the ``synth`` extra), its small tokenizer.json, the refusal of a non-empty directory.

Must not import: ``engramd.daemon``, ``engramd.shm``, ``engramd.cli``.
Imported only by: ``engramd.cli``.
"""
