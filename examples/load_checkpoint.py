"""Load a quantized HF checkpoint directory, report what is stored, run one layer.

    PYTHONPATH=. python examples/load_checkpoint.py [CHECKPOINT_DIR]

Without an argument it loads the tiny GPTQ fixture of the tests (two shards); any GPTQ
(act-order too), AWQ, compressed-tensors, ModelOpt NVFP4/FP8, gpt-oss MXFP4 or block-FP8
(DeepSeek-V3, Qwen3-FP8) directory works the same way.  Per-expert MoE layers
(``experts.{i}.gate_proj`` ...) are stacked into ``hj.quant_moe``'s weights first.
"""
import os
import sys

import jax
import jax.numpy as jnp

import humming_jax as hj

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "..", "tests", "fixtures", "checkpoints", "gptq-w4-g32-sym")


def main(path: str) -> None:
  print(f"format: {hj.checkpoints.detect_format(path)}")
  tree = hj.load_checkpoint(path)  # nested dict keyed by the checkpoint's module paths
  tree = hj.stack_experts(tree)    # experts.{i}.* -> experts.gate_up / experts.down (MoE)
  print(hj.report(tree))           # quantized layers and float tensors (ignored modules too)

  # The first quantized layer in the tree, whatever the model calls it.
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, hj.QuantizedWeight))[0]
  path_keys, layer = next((p, q) for p, q in leaves if isinstance(q, hj.QuantizedWeight))
  name = "/".join(str(k.key) for k in path_keys)
  if layer.num_experts:  # stacked experts (E, K, N): run expert 0 here
    layer = jax.tree_util.tree_map(lambda a: a[0], layer).replace(shape=layer.shape[1:])
  x = jax.random.normal(jax.random.key(0), (4, layer.in_features), jnp.bfloat16)
  y = jax.jit(hj.quant_dense)(layer, x)
  ref = x.astype(jnp.float32) @ hj.dequantize(layer)
  if layer.bias is not None:
    ref = ref + layer.bias
  err = float(jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
  print(f"{name}: {layer.spec.name}  x{tuple(x.shape)} -> y{tuple(y.shape)} {y.dtype}, "
        f"rel. diff vs x @ dequantize(W) (activations unquantized) {err:.2e}")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
