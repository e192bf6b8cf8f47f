"""humming_jax: quantized-inference GEMM kernels for JAX on NVIDIA GPUs.

    import humming_jax as hj
    spec   = hj.QuantSpec.preset("w4a16-g128")
    params = hj.quantize(w, spec)          # w: (K, N) float -> pytree
    w_hat  = hj.dequantize(params)         # (K, N) float32
    y      = hj.quant_dense(params, x)     # x: (..., K) -> (..., N)
"""
from humming_jax.checkpoints import load_checkpoint
from humming_jax.formats import FORMATS, NumberFormat, get_format
from humming_jax.ops import prepare, quant_dense
from humming_jax.quantize import (QuantizedActivations, QuantizedWeight, dequantize,
                                  fake_quantize_activations, quantize, quantize_activations)
from humming_jax.report import report
from humming_jax.recipes import RECIPES, quantize_params
from humming_jax.analysis import error_report
from humming_jax.io import load, save
from humming_jax.spec import PRESETS, QuantSpec
from humming_jax.moe import quant_moe, quant_ragged_dot

__version__ = "0.1.0"

__all__ = [
    "FORMATS", "NumberFormat", "get_format", "QuantSpec", "PRESETS", "QuantizedWeight",
    "QuantizedActivations", "quantize", "dequantize", "quantize_activations",
    "fake_quantize_activations", "quant_dense", "prepare", "report",
    "quantize_params", "RECIPES", "error_report", "save", "load",
    "moe", "quant_ragged_dot", "quant_moe",
]
__all__ += ["load_checkpoint"]
from humming_jax.sharding import partition_specs, shard_params  # noqa: E402 (hj.sharding too)
__all__ += ["partition_specs", "shard_params", "sharding"]
