"""The benchmarks' chain method (benchmarks/common.py): no work shared across layers.

With one x shared by the layers of a timed call, XLA merges their identical work on it
(CSE): W4A8's activation quantization and the MoE tile schedule ran once per call of 8
layers on the H200 (session 17 timelines), so a per-layer time left 7/8 of that work out.
``common.unshared`` routes each layer's (x, params) through its own optimization barrier.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import common


def _layer(w, x):
  return jnp.tanh(x) @ w  # the tanh is x-only work, the part XLA can merge


def _compiled(x, ws) -> str:
  return jax.jit(lambda ps, x: common.chain(_layer, ps, x)).lower(ws, x).compile().as_text()


def test_shared_x_work_is_merged_and_unshared_x_is_not():
  ws = [jnp.full((16, 8), i + 1.0) for i in range(4)]
  x = jax.random.normal(jax.random.key(0), (2, 16))
  assert _compiled(x, ws).count(" tanh(") == 1  # the premise: XLA merges it
  assert _compiled(common.unshared(x), ws).count(" tanh(") == 4


@pytest.mark.parametrize("chain", ["outputs", "resident"])
def test_unshared_inputs_give_the_same_outputs(chain):
  """Same values through the barrier, for a pytree input (MoE's (x, sizes)) too; the
  program's arguments are the params and x alone (no copies for the host to parse)."""
  ws = [jnp.full((16, 8), i + 1.0) for i in range(3)]
  x = jax.random.normal(jax.random.key(1), (2, 16))
  xs = common.unshared((x, jnp.arange(3)))
  assert common.first_input(xs)[0] is x and common.first_input(x) is x
  assert len(jax.tree.leaves(xs)) == 2
  layer = lambda w, a: _layer(w, a[0]) * a[1][1]  # uses both leaves
  outs = jax.jit(lambda ps, a: common.chain(layer, ps, a))(ws, xs)
  for w, y in zip(ws, outs):
    np.testing.assert_allclose(y, _layer(w, x), rtol=1e-6)
  if chain == "resident":
    f = jax.jit(common.resident_program(layer))
    want = sum(float(jnp.sum(_layer(w, x))) for w in ws)
    np.testing.assert_allclose(float(f(ws, xs, jnp.zeros((), jnp.float32))), want, rtol=1e-5)
    res = common.time_resident(layer, ws, xs, calls=2, repeats=1)
    assert res["us"] > 0


def test_trace_events_split_per_call_and_sum_per_kernel():
  """--span / --breakdown's trace arithmetic: events cut into calls, per-kernel time per
  layer (durations summed per call, median over calls), and a refusal when the calls'
  kernel sequences differ."""
  call = lambda t0, d: [(t0, 1.0, "schedule"), (t0 + 1, d, "gemm"), (t0 + 5, d, "gemm"),
                        (t0 + 9, 0.5, "gather")]
  events = call(0.0, 3.0) + call(100.0, 4.0) + call(200.0, 10.0)
  chunks = common.split_calls(events, 3)
  assert [c[0][0] for c in chunks] == [0.0, 100.0, 200.0]
  times = common.per_kernel_us(chunks, layers=2)
  assert times == {"schedule": 0.5, "gemm": 4.0, "gather": 0.25}  # gemm: median 8 over 2
  with pytest.raises(RuntimeError, match="split_calls: 7 GPU events for 3 calls"):
    common.split_calls(events[:7], 3)
  with pytest.raises(RuntimeError, match="sequences differ"):
    common.split_calls(call(0.0, 3.0) + [(100.0, 1.0, "other")] + call(100.0, 3.0)[1:], 2)


def test_resident_row_consumer_reads_first_rows_only():
  """consume="row": the state gains each output's first row sum (the kernels without a
  full read of their outputs); an unknown consumer is refused by name."""
  ws = [jnp.full((16, 8), i + 1.0) for i in range(3)]
  x = jax.random.normal(jax.random.key(2), (4, 16))
  f_row = jax.jit(common.resident_program(_layer, "row"))
  want = sum(float(jnp.sum(_layer(w, x)[0])) for w in ws)
  assert abs(want - sum(float(jnp.sum(_layer(w, x))) for w in ws)) > 1e-3  # rows differ
  np.testing.assert_allclose(float(f_row(ws, x, jnp.zeros((), jnp.float32))), want,
                             rtol=1e-5)
  assert common.time_resident(_layer, ws, x, calls=2, repeats=1, consume="row")["us"] > 0
  with pytest.raises(ValueError, match="consume='col'"):
    common.resident_program(_layer, "col")
