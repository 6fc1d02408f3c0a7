"""Stand-in for sglang/kernels/ops/quantization/fp4_fake_quant.py (SGLang 0.5.23): its FP8 block size only."""
FP8_BLOCK_SIZE = 32
