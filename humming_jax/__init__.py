"""humming_jax: quantized-inference GEMM kernels for JAX on NVIDIA GPUs.

    import humming_jax as hj
    spec   = hj.QuantSpec.preset("w4a16-g128")
    params = hj.quantize(w, spec)          # w: (K, N) float -> pytree
    w_hat  = hj.dequantize(params)         # (K, N) float32
    y      = hj.quant_dense(params, x)     # x: (..., K) -> (..., N)

Note: ``hj.quantize`` is the function; the module is ``humming_jax.quantize`` (import
names from it: ``from humming_jax.quantize import QuantizedWeight``).
"""
from humming_jax.formats import FORMATS, NumberFormat, get_format
from humming_jax.spec import PRESETS, QuantSpec
from humming_jax.quantize import (QuantizedActivations, QuantizedWeight, dequantize,
                                  fake_quantize_activations, quantize, quantize_activations)
from humming_jax.ops import prepare, quant_dense
from humming_jax.moe import quant_moe, quant_ragged_dot
from humming_jax.report import report
from humming_jax.analysis import error_report
from humming_jax.recipes import RECIPES, quantize_params
from humming_jax.io import load, save
from humming_jax.checkpoints import deinterleave_gate_up, load_checkpoint, stack_experts
from humming_jax.sharding import partition_specs, shard_params

__version__ = "0.1.0"

__all__ = [
    # formats and specs
    "FORMATS", "NumberFormat", "get_format", "QuantSpec", "PRESETS",
    # quantize / dequantize
    "QuantizedWeight", "QuantizedActivations", "quantize", "dequantize",
    "quantize_activations", "fake_quantize_activations",
    # compute
    "quant_dense", "prepare", "quant_ragged_dot", "quant_moe", "moe",
    # models, reports, storage
    "report", "error_report", "quantize_params", "RECIPES", "save", "load",
    "load_checkpoint", "stack_experts", "deinterleave_gate_up",
    # multi-device
    "partition_specs", "shard_params", "sharding",
]
