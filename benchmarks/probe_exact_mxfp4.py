"""Device probe (session 24): grouped W4A16 MXFP4 at Mixtral-like 128-row tiles gave rel err
exactly 0 vs the reference in test_cluster_gpu.  Which kernels run, and the fp32 diff."""
import sys; sys.path.insert(0, "tests")
import jax, jax.numpy as jnp, numpy as np
import humming_jax as hj
from humming_jax.kernels import grouped_wna16_mgpu as gm, reference
from test_grouped_wna16_mgpu import make, routed_rows
q, _ = make("w4a16-mxfp4", 8, 4096, 2048, 1, False, seed=27)
g, x = routed_rows(8, 4096, 512, seed=28)
p = jax.jit(lambda q: hj.prepare(q, grouped=True, kernel=gm.FAMILY))(q)
f = jax.jit(lambda p, x, g: hj.quant_ragged_dot(p, x, g))
y = np.asarray(f(p, x, g), np.float32)
yk = np.asarray(jax.jit(lambda p, x, g: gm.run(p, x, g))(p, x, g), np.float32)
r = np.asarray(jax.jit(reference.ragged_dot_reference)(q, x, g), np.float32)
print("layout", p.layout, "out dtype", f(p, x, g).dtype)
print("quant_ragged_dot vs ref: max abs", np.abs(y - r).max(), "n diff", int((y != r).sum()), "of", y.size)
print("gm.run vs ref: max abs", np.abs(yk - r).max(), "n diff", int((yk != r).sum()))
txt = f.lower(p, x, g).as_text()
print("mosaic in quant_ragged_dot:", "mosaic_gpu" in txt, "custom_call count", txt.count("custom_call"))
