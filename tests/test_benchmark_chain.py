"""The benchmarks' chain method (benchmarks/common.py): each layer its own input buffer.

With one x shared by the layers of a timed call, XLA merges their identical work on it
(CSE): W4A8's activation quantization and the MoE tile schedule ran once per call of 8
layers on the H200 (session 17 timelines), so a per-layer time left 7/8 of that work out.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common


def _layer(w, x):
  return jnp.tanh(x) @ w  # the tanh is x-only work, the part XLA can merge


def _tanh_count(x, ws) -> int:
  f = jax.jit(lambda ps, x: common.chain(_layer, ps, x))
  return f.lower(ws, x).compile().as_text().count(" tanh(")


def test_shared_x_work_is_merged_and_per_layer_x_is_not():
  ws = [jnp.full((16, 8), i + 1.0) for i in range(4)]
  x = jax.random.normal(jax.random.key(0), (2, 16))
  assert _tanh_count(x, ws) == 1  # the premise: XLA merges it across the layers
  assert _tanh_count(common.per_layer(x, 4), ws) == 4


def test_per_layer_inputs_are_equal_copies_through_the_chains():
  ws = [jnp.full((16, 8), i + 1.0) for i in range(3)]
  x = jax.random.normal(jax.random.key(1), (2, 16))
  xs = common.per_layer((x, jnp.arange(3)), 3)  # a pytree input, as MoE's (x, sizes)
  assert len(xs.items) == 3
  for xi in xs.items:
    np.testing.assert_array_equal(xi[0], x)
    assert xi[0] is not x
  assert common.first_input(xs) is xs.items[0] and common.first_input(x) is x
  outs = jax.jit(lambda ps, a: common.chain(lambda w, a: _layer(w, a[0]), ps, a))(ws, xs)
  for w, y in zip(ws, outs):
    np.testing.assert_allclose(y, _layer(w, x), rtol=1e-6)
  res = common.time_resident(lambda w, a: _layer(w, a[0]), ws, xs, calls=2, repeats=1)
  assert res["us"] > 0
