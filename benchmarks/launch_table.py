"""CPU tool (session 29): the grouped Mosaic kernel's default launch -- rows per tile and
Config, what ``grouped_wna16_mgpu.run`` takes without a config or a cache entry -- at
the MoE benchmark shapes and token counts, for W4A8 MXFP4 (":cf" marked and not) and
W4A16 int4 g128 zp experts on an H200's 132 SMs, from abstract params (no weights).  Run
it with two packages on PYTHONPATH and diff the outputs to see which launches a dispatch
change moves before spending device time (session 29: HEAD against 27e3afa, 126 points,
identical; session 30: the in-place build against 6090062, identical).  It asks
``grouped_wna16_mgpu.default_launch``, so both packages must be d339fbb or later.
Usage: PYTHONPATH=<package root> python benchmarks/launch_table.py"""
import jax
import jax.numpy as jnp
import humming_jax as hj
from humming_jax.kernels import (grouped_wna16_mgpu as g16, grouped_wnam_mgpu as gw, tuning,
                                 wnam_mgpu)
tuning.num_sms = lambda: 132  # the H200's
def params(name, shape, fam, cf):
  spec = hj.QuantSpec.preset(name)
  q = jax.eval_shape(lambda w: hj.quantize(w, spec), jax.ShapeDtypeStruct(shape, jnp.float32))
  p = jax.eval_shape(lambda q: hj.prepare(q, grouped=True, kernel=fam), q)
  if cf: p = p.replace(layout=p.layout + ":cf")
  if fam == gw.FAMILY:
    p = wnam_mgpu.weight_view(p, wnam_mgpu.renamed(p.layout, g16.FAMILY))
  return p
shapes = {"ds_gu": (256, 8, 512, 7168), "ds_dn": (256, 8, 7168, 256), "qw_gu": (128, 8, 1536, 2048),
          "qw_dn": (128, 8, 2048, 768), "mx_gu": (8, 2, 28672, 4096), "mx_dn": (8, 2, 4096, 14336)}
for name, fam, cf in (("w4a8-mxfp4", gw.FAMILY, True), ("w4a8-mxfp4", gw.FAMILY, False),
                      ("w4a16-g128-zp", g16.FAMILY, False)):
  for s, (e, topk, n, k) in shapes.items():
    p = params(name, (e, k, n), fam, cf)
    for t in (1, 16, 64, 256, 512, 1024, 4096):
      m = t * topk
      rows = g16.tile_rows(m, e, p)
      cfg = g16.default_launch(m, p, rows)
      print(name, cf, s, t, rows, cfg)
