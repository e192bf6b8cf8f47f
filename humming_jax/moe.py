"""Mixture of experts: routing (pure functions), the quantized grouped GEMM, the MoE layer.

Routing::

    weights, ids = topk_routing(logits, k)                 # (T, k) float32, (T, k) int32
    r = sort_tokens(ids, num_experts)                      # rows sorted by expert
    xs = x[r.token_of_row]                                 # (T*k, H)
    ys = quant_ragged_dot(params, xs, r.group_sizes)       # (T*k, N)
    out = combine(ys, weights, r)                          # (T, N)

``quant_moe`` is that chain with the gate/up GEMM, the GLU and the down GEMM.  Everything is
jit-safe with static shapes: no host sync, nothing depends on the routing's values but data.

Conventions: ``gate_up`` holds the gate projection in its first N/2 columns and the up
projection in its last N/2 (as Mixtral / Qwen / DeepSeek checkpoints concatenate
``w1``/``gate_proj`` then ``w3``/``up_proj``); ``glu(h) = act(h[:, :I]) * h[:, I:]``
(gpt-oss: ``hj.deinterleave_gate_up`` and its clamped "swigluoai", see :func:`glu`).
"""
from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from humming_jax import autodiff, ops
from humming_jax.kernels import (grouped_wna16, grouped_wna16_mgpu, grouped_wnam_mgpu, registry,
                                 tuning, wna16_mgpu_dx)
from humming_jax.quantize import (QuantizedWeight, check_no_input_perm, check_params,
                                  fake_quantize_activations)
from humming_jax.spec import as_int

Activation = Literal["silu", "gelu", "swigluoai"]
ACTIVATIONS = ("silu", "gelu", "swigluoai")


def check_activation(activation: str) -> None:
  """``activation`` names a GLU of :func:`glu` (a ValueError lists them)."""
  if activation not in ACTIVATIONS:
    raise ValueError(f"activation={activation!r}; expected one of {ACTIVATIONS}")


# gpt-oss's clamped SwiGLU ("swigluoai", vLLM's name): gate clipped above, up to +-limit,
# gate * sigmoid(alpha * gate) * (up + 1)
SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT = 1.702, 7.0


# ----------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------
def topk_routing(logits: jax.Array, k: int, *, renormalize: bool = True,
                 order: Literal["softmax_topk", "topk_softmax"] = "softmax_topk",
                 scoring: Literal["softmax", "sigmoid"] = "softmax",
                 correction_bias: jax.Array | None = None, num_groups: int | None = None,
                 topk_groups: int | None = None, scaling_factor: float = 1.0
                 ) -> tuple[jax.Array, jax.Array]:
  """Router logits (T, E) -> (weights (T, k) float32, expert ids (T, k) int32).

  ``order="softmax_topk"``: softmax over all E experts, keep the k largest (Mixtral with
  ``renormalize=True``, Qwen3-MoE with its ``norm_topk_prob``).  ``"topk_softmax"``: keep
  the k largest logits, softmax over those k (gpt-oss; the weights already sum to 1).

  DeepSeek-style routers (as DeepSeek's reference ``Gate``):
    scoring:         ``"sigmoid"``: per-expert sigmoid scores instead of a softmax
                     (DeepSeek-V3; ``order`` must stay "softmax_topk").
    correction_bias: (E,) added to the scores to *choose* the experts only; the weights
                     are the unbiased scores of the chosen ones (V3's
                     ``e_score_correction_bias``).
    num_groups, topk_groups: group-limited choice: the E experts form ``num_groups``
                     equal groups, each scored by its best expert (no correction bias:
                     DeepSeek-V2) or by the sum of its two best biased scores (with one:
                     V3); experts outside the ``topk_groups`` best groups are not chosen.
    scaling_factor:  the weights' final factor (``routed_scaling_factor``), after
                     ``renormalize``.
  DeepSeek-V3: ``topk_routing(logits, 8, scoring="sigmoid", correction_bias=b,
  num_groups=8, topk_groups=4, scaling_factor=2.5)``.  Ties pick the lower expert id
  (``lax.top_k``)."""
  if logits.ndim != 2:
    raise ValueError(f"logits must be (tokens, experts); got shape {logits.shape}")
  e = logits.shape[1]
  k = as_int("k", k)  # (a numpy int from a config is an int)
  if k is None or not 0 < k <= e:
    raise ValueError(f"k={k!r} must be an int in [1, num_experts={e}]")
  num_groups, topk_groups = _routing_options(order, scoring, num_groups, topk_groups,
                                             correction_bias is not None)
  grouped = num_groups is not None
  if grouped:
    if not (num_groups > 0 and e % num_groups == 0):
      raise ValueError(f"num_groups={num_groups!r} must be a positive int dividing "
                       f"num_experts={e}")
    if not (0 < topk_groups <= num_groups and k <= topk_groups * (e // num_groups)):
      raise ValueError(f"topk_groups={topk_groups!r} must be an int in [1, num_groups="
                       f"{num_groups}] whose groups hold at least k={k} experts")
  z = logits.astype(jnp.float32)
  if order == "topk_softmax":
    top, ids = jax.lax.top_k(z, k)
    w = jax.nn.softmax(top, axis=-1)
  else:
    scores = jax.nn.sigmoid(z) if scoring == "sigmoid" else jax.nn.softmax(z, axis=-1)
    choice = scores
    if correction_bias is not None:
      correction_bias = jnp.asarray(correction_bias, jnp.float32)
      if correction_bias.shape != (e,):
        raise ValueError(f"correction_bias.shape={correction_bias.shape}: expected "
                         f"(num_experts,)=({e},)")
      choice = scores + correction_bias
    if grouped:
      per_group = choice.reshape(-1, num_groups, e // num_groups)
      group_score = (jnp.max(per_group, axis=-1) if correction_bias is None
                     else jnp.sum(jax.lax.top_k(per_group, min(2, e // num_groups))[0],
                                  axis=-1))
      _, best = jax.lax.top_k(group_score, topk_groups)  # (T, topk_groups)
      keep = jnp.any(best[:, :, None] == jnp.arange(num_groups), axis=1)  # (T, groups)
      choice = jnp.where(keep[:, :, None], per_group, -jnp.inf).reshape(-1, e)
    _, ids = jax.lax.top_k(choice, k)
    w = jnp.take_along_axis(scores, ids, axis=-1)
  if renormalize:
    w = w / jnp.sum(w, axis=-1, keepdims=True)
  return w * jnp.float32(scaling_factor), ids.astype(jnp.int32)


def _routing_options(order: str, scoring: str, num_groups, topk_groups,
                     biased: bool) -> tuple[int | None, int | None]:
  """:func:`topk_routing`'s options checked as far as they can be without the logits
  (:class:`Routing` checks them at construction): (num_groups, topk_groups) as ints or
  both None."""
  if order not in ("softmax_topk", "topk_softmax"):
    raise ValueError(f"order={order!r}; expected 'softmax_topk' or 'topk_softmax'")
  if scoring not in ("softmax", "sigmoid"):
    raise ValueError(f"scoring={scoring!r}; expected 'softmax' or 'sigmoid'")
  if (num_groups is None) != (topk_groups is None):
    raise ValueError(f"num_groups={num_groups!r}, topk_groups={topk_groups!r}: give both "
                     f"for group-limited routing, or neither")
  # sigmoid scores, a correction bias and a group limit all act on every expert's score
  # before the top-k: top-k-then-softmax has no such score
  scored = [name for name, on in (("scoring='sigmoid'", scoring == "sigmoid"),
                                  ("correction_bias", biased),
                                  ("num_groups", num_groups is not None)) if on]
  if scored and order != "softmax_topk":
    raise ValueError(f"{' and '.join(scored)} act{'s' if len(scored) == 1 else ''} on every "
                     f"expert's score before the top-k: leave order='softmax_topk'")
  return as_int("num_groups", num_groups), as_int("topk_groups", topk_groups)


@dataclasses.dataclass(frozen=True)
class Routing:
  """How the MoE modules (``QuantMoE``, linen and nnx) route: :func:`topk_routing`'s
  options, and what the router holds beside its kernel.

  renormalize, order, scoring, num_groups, topk_groups, scaling_factor: as
  :func:`topk_routing`.
  router_bias:     the router's Dense / Linear has a bias (gpt-oss).
  correction_bias: the module holds an (E,) ``correction_bias`` parameter (zeros at init)
                   added to the scores to choose experts (DeepSeek-V3's
                   ``e_score_correction_bias``).
  DeepSeek-V3: ``Routing(scoring="sigmoid", correction_bias=True, num_groups=8,
  topk_groups=4, scaling_factor=2.5)``; gpt-oss: ``Routing(order="topk_softmax",
  router_bias=True)``."""

  renormalize: bool = True
  order: Literal["softmax_topk", "topk_softmax"] = "softmax_topk"
  scoring: Literal["softmax", "sigmoid"] = "softmax"
  num_groups: int | None = None
  topk_groups: int | None = None
  scaling_factor: float = 1.0
  router_bias: bool = False
  correction_bias: bool = False

  def __post_init__(self):  # what can be checked before the number of experts is known
    groups = _routing_options(self.order, self.scoring, self.num_groups, self.topk_groups,
                              self.correction_bias)
    for name, value in zip(("num_groups", "topk_groups"), groups):
      object.__setattr__(self, name, value)

  def route(self, logits: jax.Array, k: int, correction_bias: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array]:
    """:func:`topk_routing` of ``logits`` with these options (``correction_bias``: the
    module's parameter, given exactly when :attr:`correction_bias` is set)."""
    if (correction_bias is not None) != self.correction_bias:
      raise ValueError(f"Routing.correction_bias={self.correction_bias} but a correction "
                       f"bias was{' not' if correction_bias is None else ''} given")
    return topk_routing(logits, k, renormalize=self.renormalize, order=self.order,
                        scoring=self.scoring, correction_bias=correction_bias,
                        num_groups=self.num_groups, topk_groups=self.topk_groups,
                        scaling_factor=self.scaling_factor)


class SortedTokens(NamedTuple):
  """Rows of the (T*k, ...) expert-sorted activations and how to undo the sort.

  token_of_row: (R,) int32 token feeding each sorted row (padding rows: token 0, masked).
  slot_of_row:  (R,) int32 flat ``t * k + j`` index of each row into (T, k), or T*k for a
                padding row.
  row_of_slot:  (T*k,) int32 inverse permutation: the sorted row of ``(t, j)``.
  group_sizes:  (E,) int32 rows per expert (including padding when aligned).
  valid:        (R,) bool, False on padding rows and on rows of ids outside [0, E).
  """

  token_of_row: jax.Array
  slot_of_row: jax.Array
  row_of_slot: jax.Array
  group_sizes: jax.Array
  valid: jax.Array


def _check_ids(topk_ids: jax.Array, num_experts: int) -> None:
  if topk_ids.ndim != 2:
    raise ValueError(f"topk_ids must be (tokens, k); got shape {topk_ids.shape}")
  if not jnp.issubdtype(topk_ids.dtype, jnp.integer):
    raise ValueError(f"topk_ids must be integer expert ids; got dtype {topk_ids.dtype}")
  if not isinstance(num_experts, int) or num_experts < 1:
    raise ValueError(f"num_experts={num_experts!r} must be a positive int")


def sort_tokens(topk_ids: jax.Array, num_experts: int) -> SortedTokens:
  """Sort the T*k (token, slot) pairs by expert (stable: token order within an expert).

  Ids outside [0, E) are sorted past the last expert: their rows lie beyond
  ``sum(group_sizes)``, so the grouped GEMM writes zeros there and they add nothing."""
  _check_ids(topk_ids, num_experts)
  t, k = topk_ids.shape
  flat = topk_ids.reshape(-1).astype(jnp.int32)
  key = jnp.where((flat >= 0) & (flat < num_experts), flat, num_experts)
  order = jnp.argsort(key, stable=True).astype(jnp.int32)
  inv = jnp.zeros_like(order).at[order].set(jnp.arange(t * k, dtype=jnp.int32))
  sizes = jnp.zeros((num_experts,), jnp.int32).at[key].add(1, mode="drop")
  # rows of out-of-range ids (sorted past the last expert) are not valid: they add nothing
  valid = jnp.arange(t * k, dtype=jnp.int32) < jnp.sum(sizes)
  return SortedTokens(order // k, order, inv, sizes, valid)


def align_tokens(topk_ids: jax.Array, num_experts: int, block_m: int) -> SortedTokens:
  """Like :func:`sort_tokens`, but every expert's segment is padded to a multiple of
  ``block_m`` rows (vLLM's ``moe_align_block_size``), so no kernel tile mixes experts.

  The row count is static: ``T*k + min(E, T*k)*(block_m - 1)`` rounded up to ``block_m``
  (the worst case: at most min(E, T*k) experts are non-empty); unused rows at the end are
  padding (``valid`` False, past sum(group_sizes)).  :func:`quant_moe` uses it for params
  prepared for the Mosaic grouped kernel past decode (each tile then stores its rows in
  place; at decode a tile per pair, :func:`pair_tiles`); the
  Triton grouped kernels do not need it (they mask rows per expert)."""
  _check_ids(topk_ids, num_experts)
  if not isinstance(block_m, int) or block_m < 1:
    raise ValueError(f"block_m={block_m!r} must be a positive int")
  base = sort_tokens(topk_ids, num_experts)
  t, k = topk_ids.shape
  n = t * k
  rows = -(-(n + min(num_experts, n) * (block_m - 1)) // block_m) * block_m
  padded = (base.group_sizes + block_m - 1) // block_m * block_m
  # the cumsums over E computed once, not fused into the (T*k,) gathers that read them
  # (HUMMING_JAX_ALIGNED_SCHEDULE=xla: as XLA fuses them; grouped_wna16_mgpu.ALIGNED_SCHEDULE)
  ends = (jnp.cumsum(padded), jnp.cumsum(base.group_sizes))
  if grouped_wna16_mgpu.aligned_schedule_mode() != "xla":
    ends = jax.lax.optimization_barrier(ends)
  seg_end, raw_end = ends
  seg_start = seg_end - padded
  raw_start = raw_end - base.group_sizes
  flat = topk_ids.reshape(-1).astype(jnp.int32)
  in_range = (flat >= 0) & (flat < num_experts)
  e_of_sorted = jnp.where(in_range, flat, 0)[base.slot_of_row]
  ok_sorted = in_range[base.slot_of_row]
  i = jnp.arange(n, dtype=jnp.int32)
  dest = seg_start[e_of_sorted] + i - raw_start[e_of_sorted]
  dest = jnp.where(ok_sorted, dest, rows)  # invalid ids: dropped (no row)
  slot_of_row = jnp.full((rows,), n, jnp.int32).at[dest].set(base.slot_of_row, mode="drop")
  valid = slot_of_row < n
  token_of_row = jnp.where(valid, slot_of_row // k, 0)
  row_of_slot = jnp.full((n,), rows, jnp.int32).at[base.slot_of_row].set(dest)
  return SortedTokens(token_of_row, slot_of_row, row_of_slot, padded, valid)


def combine(rows: jax.Array, topk_weights: jax.Array, sorted_tokens: SortedTokens
            ) -> jax.Array:
  """Expert-sorted outputs (R, N) -> (T, N): ``sum_j w[t, j] * rows[row_of_slot(t, j)]``.

  A gather plus a k-term sum in float32 (deterministic; no scatter-add)."""
  return _weighted_rows(rows, topk_weights, sorted_tokens.row_of_slot)


def _weighted_rows(rows: jax.Array, topk_weights: jax.Array, row_of_slot: jax.Array
                   ) -> jax.Array:
  """``sum_j w[t, j] * rows[row_of_slot[t * k + j]]``; an index past the rows reads zero
  (a gather fill: rows there may be unwritten memory, never multiplied)."""
  t, k = topk_weights.shape
  idx = row_of_slot.reshape(t, k)
  g = jnp.take(rows, idx, axis=0, mode="fill", fill_value=0).astype(jnp.float32)
  return jnp.einsum("tkn,tk->tn", g, topk_weights.astype(jnp.float32)).astype(rows.dtype)


# ----------------------------------------------------------------------------------------
# Grouped GEMM
# ----------------------------------------------------------------------------------------
def _check_grouped(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array) -> None:
  if not isinstance(params, QuantizedWeight):
    raise TypeError(f"params must be a QuantizedWeight (from hj.quantize on (E, K, N) "
                    f"weights); got {type(params).__name__}")
  if params.num_experts is None:
    raise ValueError(f"params must hold stacked experts (E, K, N); got shape "
                     f"{params.shape} (use quant_dense)")
  check_params(params, "quant_ragged_dot: params")
  check_no_input_perm(params, "params")
  ops.check_activations(x, "quant_ragged_dot")
  if x.ndim != 2 or x.shape[1] != params.in_features:
    raise ValueError(f"x must be (M, K={params.in_features}); got shape {x.shape}")
  if not hasattr(group_sizes, "shape"):
    raise TypeError(f"group_sizes must be an (E,) integer array; got "
                    f"{type(group_sizes).__name__}")
  if group_sizes.shape != (params.num_experts,):
    raise ValueError(f"group_sizes must have shape (E,)=({params.num_experts},); got "
                     f"{group_sizes.shape}")
  if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
    raise ValueError(f"group_sizes must be integer; got dtype {group_sizes.dtype}")
  if isinstance(group_sizes, np.ndarray):  # host values: checked for free (device ones
    if (group_sizes < 0).any():            # would cost a sync; traced ones cannot be)
      raise ValueError(f"group_sizes must be >= 0; got {group_sizes.tolist()}")
    if group_sizes.sum() > x.shape[0]:
      raise ValueError(f"group_sizes sum to {int(group_sizes.sum())}, more than x's "
                       f"{x.shape[0]} rows")


def _xla_block_m(m: int, e: int) -> int:
  rows = grouped_wna16.rows_per_active_expert(m, e)
  return 8 if rows <= 8 else (32 if rows <= 32 else 128)


def ragged_dot_xla(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array, *,
                   block_m: int | None = None, chunk_bytes: int = 1 << 28,
                   exact: bool = True) -> jax.Array:
  """The XLA grouped GEMM (CPU fallback, and any spec without a grouped kernel).

  Not ``lax.ragged_dot`` (which XLA expands to a dense masked E-fold product on the GPU):
  rows are cut into expert-pure tiles of ``block_m`` rows (:func:`tile_schedule`, as in the
  kernel); a ``lax.map`` over chunks of tiles gathers each tile's expert *codes*,
  dequantizes only those and runs a batched (tile, block_m, K) x (tile, K, N) dot.
  Cost: ``tiles * (K*N)`` weight elements decoded (tiles <= cdiv(M, block_m) + min(E, M),
  so at decode only the active experts) and ``tiles * block_m * K * N`` MACs; memory
  ``chunk * K * N`` floats per step (``chunk_bytes`` bounds it), never E*M*N.
  Only the gathered experts are decoded, prepared ones in their own layout where their
  family can (``registry.dequantize``).  ``exact=False`` with 16-bit x computes in x's
  dtype (weights rounded to it, products accumulated in float32 inside the GEMM), as
  :func:`ragged_dot_gradient_reference` differentiates it."""
  spec = params.spec
  e, k, n = params.shape
  m = x.shape[0]
  dt = (x.dtype if not exact and x.dtype in (jnp.bfloat16, jnp.float16) else jnp.float32)
  a = (fake_quantize_activations(x, spec, params.act_scale) if spec.act else x).astype(dt)
  bm = block_m or _xla_block_m(m, e)
  num_tiles = grouped_wna16.max_tiles(m, e, bm)
  expert, start, end, kind = grouped_wna16.tile_schedule(group_sizes, m, bm, num_tiles)
  chunk = max(1, min(num_tiles, chunk_bytes // (2 * jnp.dtype(dt).itemsize * k * n)))
  # (the weights and temporaries of a chunk)
  pad = -num_tiles % chunk
  expert, start, end, kind = (jnp.pad(v, (0, pad)) for v in (expert, start, end, kind))
  a = jnp.pad(a, ((0, bm), (0, 0)))

  def step(args):
    ex, st, en, kd = args
    # every leaf of a stack (any layout) has the experts on its first axis, but act_scale
    # (shared, unused by the decode) and input_perm (refused for experts)
    sub = jax.tree.map(lambda leaf: leaf[ex], params.replace(bias=None, act_scale=None))
    w = registry.dequantize(sub.replace(shape=(ex.shape[0], k, n)), dt)  # (chunk, K, N)
    rows = st[:, None] + jnp.arange(bm, dtype=jnp.int32)[None, :]
    ok = (rows < en[:, None]) & (kd[:, None] == 1)
    # rows outside the tile's expert read as zero, as in the kernels: their values (NaN,
    # inf past sum(group_sizes)) must not reach the weights' cotangent either
    xs = jnp.where(ok[..., None], a[rows], jnp.zeros((), dt))  # (chunk, bm, K)
    # float32 x: a float32 product; 16-bit (exact=False): in x's dtype, so that the
    # product's cotangent, and the backward's GEMMs, stay 16-bit
    y = jnp.einsum("cmk,ckn->cmn", xs, w)
    if params.bias is not None:
      y = y + params.bias[ex][:, None, :]
    return jnp.where(ok[..., None], y, jnp.zeros((), y.dtype)), jnp.where(rows < en[:, None],
                                                                        rows, m)

  nchunks = (num_tiles + pad) // chunk
  # Checkpointed: differentiated (quant_ragged_dot's backward), each chunk decodes its
  # experts again instead of keeping every chunk's weights for the backward.
  ys, rows = jax.lax.map(jax.checkpoint(step), tuple(v.reshape(nchunks, chunk)
                                     for v in (expert, start, end, kind)))
  out = jnp.zeros((m, n), ys.dtype).at[rows.reshape(-1)].set(ys.reshape(-1, n), mode="drop")
  return out.astype(x.dtype)


def ragged_dot_gradient_reference(params: QuantizedWeight, x: jax.Array,
                                  group_sizes: jax.Array) -> jax.Array:
  """:func:`ragged_dot_xla` as quant_ragged_dot's and quant_moe's backward differentiates
  it: 16-bit x in x's dtype (as ``reference.dense_gradient_reference``: the backward's
  GEMMs 16-bit, weights rounded to x's dtype), float32 x exact."""
  return ragged_dot_xla(params, x, group_sizes, exact=False)


def quant_ragged_dot(params: QuantizedWeight, x: jax.Array, group_sizes: jax.Array, *,
                     backend: ops.Backend = None) -> jax.Array:
  """``lax.ragged_dot`` with quantized stacked experts: (M, K) x (E, K, N) -> (M, N).

  Args:
    params: ``hj.quantize`` of stacked (E, K, N) weights, canonical or prepared once with
      ``hj.prepare(params, grouped=True)``.  Pass prepared params on the Pallas path:
      canonical ones are prepared *inside every call* -- an unpack + re-pack of all E
      experts' codes (about 3x the stacked weight bytes of memory traffic, whatever the
      routing), which dominates the call at decode.  Prepared params are used as they are.
    x: (M, K) float activations, rows sorted by expert.
    group_sizes: (E,) int rows per expert; rows past ``sum(group_sizes)`` come out zero.
    backend: "pallas" | "interpret" | "xla" | None (see ops.py).
  Returns (M, N) in x's dtype.  jit-safe with static M; no host sync.  Differentiable in
  reverse mode: the backward is :func:`ragged_dot_xla`'s VJP (humming_jax/autodiff.py).
  """
  _check_grouped(params, x, group_sizes)
  b, kernel = ops.backend_and_kernel(params, x.dtype, backend, grouped=True)
  run = lambda p, a, gs: kernel.run(ops.in_layout_of(kernel, p), a, gs,
                                    interpret=(b == "interpret"))
  return autodiff.kernel_or_reference(
      b, run, ragged_dot_xla, ("params", "x", "group_sizes"),
      gradient=ragged_dot_gradient_reference,
      x_cotangent=lambda p, a, gs, dy: wna16_mgpu_dx.cotangent(p, a, dy, gs,
                                                               interpret=b == "interpret"),
  )(params, x, group_sizes)


# ----------------------------------------------------------------------------------------
# The MoE layer
# ----------------------------------------------------------------------------------------
def glu(h: jax.Array, activation: Activation = "silu") -> jax.Array:
  """``act(gate) * up`` of (R, 2I) gate/up rows (gate first), in float32 -> h.dtype.
  "swigluoai" (gpt-oss): ``g * sigmoid(1.702 g) * (u + 1)`` with g clipped to <= 7 and u
  to [-7, 7] (its interleaved gate/up columns: ``hj.deinterleave_gate_up`` first)."""
  check_activation(activation)
  if h.shape[-1] % 2:
    raise ValueError(f"h.shape={h.shape}: the last axis holds gate then up, so it must be "
                     f"even")
  i = h.shape[-1] // 2
  g, u = h[..., :i].astype(jnp.float32), h[..., i:].astype(jnp.float32)
  if activation == "swigluoai":
    g = jnp.minimum(g, SWIGLUOAI_LIMIT)
    u = jnp.clip(u, -SWIGLUOAI_LIMIT, SWIGLUOAI_LIMIT)
    return (g * jax.nn.sigmoid(SWIGLUOAI_ALPHA * g) * (u + 1)).astype(h.dtype)
  act = jax.nn.silu(g) if activation == "silu" else jax.nn.gelu(g, approximate=False)
  return (act * u).astype(h.dtype)


def layer_kernel(gate_up_params: QuantizedWeight, down_params: QuantizedWeight) -> str | None:
  """The grouped kernel family for both expert stacks of one MoE layer, or None (each
  stack on its own default, ``hj.prepare(p, grouped=True)``).

  Both stacks go to the Mosaic grouped kernel whenever it runs both specs (Hopper, or the
  interpreter), so :func:`quant_moe` takes its tile-aligned path (no row gather; at decode
  a tile per routed pair, no sort).  Whole
  layers on the H200 (benchmarks/NOTES_moe.md session 9; int4 g128 zp, chain of 8, us per
  layer, both stacks on Mosaic vs the per-stack default):
  DeepSeek-V3 (H 7168, I 256) 41.4 / 168.7 / 331.3 vs 53.5 / 210.4 / 457.3 at 1 / 16 / 64
  tokens; Qwen3-30B-A3B (H 2048, I 768) vs both on Pallas-Triton 43.8 / 147.8 vs 50.1 /
  200.0 at 1 / 16 (CUPTI kernel sums 23.8 / 140.8 vs 33.2 / 190.1), 228.5 vs 243.1 at 64.
  (Session 9's per-stack default put DeepSeek-V3 down on Triton; since session 34 a lone
  K-256 stack takes the Mosaic kernel too.)  A single grouped GEMM (``quant_ragged_dot``)
  keeps the per-stack default: Triton below K 256.  The Mosaic kernel takes 16-bit
  tokens: prepare a float32 model's experts with ``kernel="grouped_wna16"``."""
  mosaic = registry.by_name(grouped_wna16_mgpu.FAMILY, grouped=True)
  if mosaic.supports(gate_up_params.spec) and mosaic.supports(down_params.spec):
    return mosaic.name
  return None


def prepare_experts(gate_up_params: QuantizedWeight, down_params: QuantizedWeight, *,
                    kernel: str | None = None) -> tuple[QuantizedWeight, QuantizedWeight]:
  """Both expert stacks of one MoE layer in a kernel layout, chosen for the layer
  (:func:`layer_kernel`) unless ``kernel`` names a grouped family: the ``hj.prepare`` of
  :func:`quant_moe`'s two stacks.  ``recipes.prepare_params`` applies it to every
  ``gate_up`` / ``down`` pair of a parameter tree."""
  for name, p in (("gate_up_params", gate_up_params), ("down_params", down_params)):
    if not isinstance(p, QuantizedWeight) or p.num_experts is None:
      raise TypeError(f"{name} must be a stacked-expert QuantizedWeight (E, K, N); got "
                      f"{getattr(p, 'shape', type(p).__name__)}")
  kernel = kernel or layer_kernel(gate_up_params, down_params)
  return (ops.prepare(gate_up_params, grouped=True, kernel=kernel),
          ops.prepare(down_params, grouped=True, kernel=kernel))


def quant_moe(gate_up_params: QuantizedWeight, down_params: QuantizedWeight, x: jax.Array,
              topk_weights: jax.Array, topk_ids: jax.Array, *,
              activation: Activation = "silu", backend: ops.Backend = None) -> jax.Array:
  """A routed MoE MLP with quantized experts: (T, H) tokens -> (T, H).

  ``out[t] = sum_j w[t, j] * down_e( glu( gate_up_e(x[t]) ) )`` with ``e = ids[t, j]``.

  Args:
    gate_up_params: (E, H, 2I) quantized experts: gate in columns [0, I), up in [I, 2I).
    down_params: (E, I, H) quantized experts.
    x: (T, H) float tokens.
    topk_weights: (T, k) combine weights (e.g. from :func:`topk_routing`).
    topk_ids: (T, k) int expert ids; ids outside [0, E) contribute nothing.
    activation: "silu" (SwiGLU), "gelu" (exact-erf GeGLU) or "swigluoai" (gpt-oss's clamped
      SwiGLU, on gate-first columns: ``hj.deinterleave_gate_up``).
    backend: as :func:`quant_ragged_dot`.

  Kernels: each stack runs on the grouped family it was prepared for
  (:func:`prepare_experts` picks for the layer: both on the Mosaic GPU kernel where it
  runs both specs, else each stack's ``hj.prepare(p, grouped=True)`` default; canonical
  params with bf16 / fp16 tokens get the same choice, prepared inside the call).  When
  both stacks are on the Mosaic kernel and the tokens are bf16 / fp16, each expert's rows
  are padded to its tile (:func:`align_tokens`) so every tile reads and
  writes its rows in place (no row gather; benchmarks/NOTES_moe.md); at decode (one token,
  or while the pairs' weight reads stay small beside E: :func:`pair_tiles`;
  HUMMING_JAX_MOE_PAIR_TOKENS=N forces it up to N tokens, 0 never) there is no sort at
  all: a tile per routed (token, slot) pair, straight from ``topk_ids``.  Otherwise (e.g.
  stacks prepared one by one, gate_up on Mosaic and down on Triton) rows are sorted by
  expert (:func:`sort_tokens`) and each GEMM is :func:`quant_ragged_dot` on its own family;
  gate_up experts on the
  grouped fp8-MMA route (W4A8 MXFP4 with per-token or static activation scales) take the T
  tokens quantized once, their e4m3 codes and scales then gathered (the same operands as
  quantizing the T*k gathered rows; HUMMING_JAX_MOE_QUANTIZE_FIRST=0 gathers the rows).
  """
  for name, p in (("gate_up_params", gate_up_params), ("down_params", down_params)):
    if not isinstance(p, QuantizedWeight) or p.num_experts is None:
      raise TypeError(f"{name} must be a stacked-expert QuantizedWeight (E, K, N); got "
                      f"{getattr(p, 'shape', type(p).__name__)}")
    check_params(p, f"quant_moe: {name}")
    check_no_input_perm(p, name)
  e, h, n2 = gate_up_params.shape
  if n2 % 2:
    raise ValueError(f"gate_up_params N={n2} must be even (gate and up stacked along N)")
  if down_params.shape != (e, n2 // 2, h):
    raise ValueError(f"down_params.shape must be (E, I, H)={(e, n2 // 2, h)} for gate_up "
                     f"{gate_up_params.shape}; got {down_params.shape}")
  ops.check_activations(x, "quant_moe")
  if x.ndim != 2 or x.shape[1] != h:
    raise ValueError(f"x must be (tokens, H={h}); got shape {x.shape}")
  if topk_weights.shape != topk_ids.shape or topk_ids.shape[:1] != x.shape[:1]:
    raise ValueError(f"topk_weights {topk_weights.shape} and topk_ids {topk_ids.shape} "
                     f"must both be (tokens={x.shape[0]}, k)")
  check_activation(activation)
  _check_ids(topk_ids, e)
  if x.shape[0] == 0 or topk_ids.shape[1] == 0:  # nothing routed (the row gathers need a row)
    return jnp.zeros((x.shape[0], h), x.dtype)
  forward = lambda gu, dn, a, w, ids: _quant_moe_forward(gu, dn, a, w, ids, activation,
                                                          backend)
  b = ops.resolve_backend(backend, gate_up_params.spec, grouped=True, x_dtype=x.dtype)
  reference = lambda gu, dn, a, w, ids: _quant_moe_gradient_reference(gu, dn, a, w, ids,
                                                                      activation, b)
  return autodiff.with_reference_vjp(
      forward, reference, ("gate_up_params", "down_params", "x", "topk_weights", "topk_ids")
  )(gate_up_params, down_params, x, topk_weights, topk_ids)


def _quant_moe_forward(gate_up_params: QuantizedWeight, down_params: QuantizedWeight,
                       x: jax.Array, topk_weights: jax.Array, topk_ids: jax.Array,
                       activation: Activation, backend: ops.Backend) -> jax.Array:
  """quant_moe's forward on the chosen kernels (validated arguments, tokens routed)."""
  e = gate_up_params.shape[0]
  b = ops.resolve_backend(backend, gate_up_params.spec, grouped=True, x_dtype=x.dtype)
  if (b != "xla" and x.dtype in (jnp.bfloat16, jnp.float16)
      and "canonical" in (gate_up_params.layout, down_params.layout)
      and (fam := layer_kernel(gate_up_params, down_params)) is not None):
    # canonical stacks: the layer's choice, prepared inside the call (a re-layout per call)
    gate_up_params, down_params = (
        p if p.layout != "canonical" else ops.prepare(p, grouped=True, kernel=fam)
        for p in (gate_up_params, down_params))
  aligned = _aligned_mosaic(gate_up_params, down_params, x, b)
  if aligned and pair_tiles(x.shape[0], topk_ids.shape[1], e,
                            (gate_up_params.nbytes() + down_params.nbytes()) // e):
    return _quant_moe_pairs(gate_up_params, down_params, x, topk_weights, topk_ids,
                            activation, interpret=b == "interpret")
  if aligned:
    # Segments padded to the tile (align_tokens): each Mosaic tile reads and writes its own
    # rows in place -- no row gather after either GEMM.
    bm = grouped_wna16_mgpu.aligned_tile_rows(topk_ids.size, e, gate_up_params, down_params)
    r = align_tokens(topk_ids, e, bm)
    run = lambda p, a: grouped_wna16_mgpu.run_aligned(p, a, r.group_sizes, block_m=bm,
                                                       interpret=b == "interpret")
    hid = None
  else:
    r = sort_tokens(topk_ids, e)
    run = lambda p, a: quant_ragged_dot(p, a, r.group_sizes, backend=backend)
    hid = _gate_up_quantized_first(gate_up_params, x, r, backend)
  return _moe_rows(gate_up_params, down_params, x, topk_weights, r, activation, run, hid)


def _quant_moe_gradient_reference(gate_up_params: QuantizedWeight,
                                  down_params: QuantizedWeight, x: jax.Array,
                                  topk_weights: jax.Array, topk_ids: jax.Array,
                                  activation: Activation, backend: str = "xla") -> jax.Array:
  """quant_moe as its backward differentiates it: rows sorted by expert, each GEMM on
  :func:`ragged_dot_gradient_reference` (XLA: it decodes the routed experts), or, on a
  kernel ``backend`` where the dx kernel takes the GEMM (opt-in,
  ``wna16_mgpu_dx.applies``), on :func:`quant_ragged_dot`: its kernel forward recomputes
  the GLU's input and the dx kernel gives its cotangent of x, so no expert is decoded by
  XLA in the backward (the gradient is then taken at the kernel's gate_up output, not
  XLA's: the same up to rounding)."""
  r = sort_tokens(topk_ids, gate_up_params.shape[0])

  def run(p, a):
    dy_like = jax.ShapeDtypeStruct((a.shape[0], p.shape[-1]), a.dtype)
    if backend != "xla" and wna16_mgpu_dx.applies(p, dy_like, r.group_sizes):
      return quant_ragged_dot(p, a, r.group_sizes, backend=backend)
    return ragged_dot_gradient_reference(p, a, r.group_sizes)
  return _moe_rows(gate_up_params, down_params, x, topk_weights, r, activation, run)


def _moe_rows(gate_up_params: QuantizedWeight, down_params: QuantizedWeight, x: jax.Array,
              topk_weights: jax.Array, r, activation: Activation, run,
              hid: jax.Array | None = None) -> jax.Array:
  """The layer on routed rows ``r`` (sorted or aligned): ``run(params, rows)`` for each
  grouped GEMM (gate_up unless its output ``hid`` is given), the GLU between, the top-k
  combine after."""
  if hid is None:
    hid = run(gate_up_params, jnp.take(x, r.token_of_row, axis=0))
  ys = run(down_params, glu(hid, activation))
  return combine(ys, topk_weights, r).astype(x.dtype)


# quant_moe's Mosaic path runs a tile per routed (token, slot) pair instead of sorting rows
# by expert while the P = T * k pairs stay few beside the E experts.  Pairs that share an
# expert read its weights once per pair (a random routing of P pairs to E experts repeats
# about P - E * (1 - (1 - 1/E)**P) of them); the sorted path pays its routing launches
# instead (sort, alignment scatters, schedule, row gathers).  H200, whole layer
# (bench_moe_layer, int4 g128 zp, outputs chain of 8), pair tiles / sorted in one process,
# µs per layer:
#   DeepSeek-V3 (E 256, top-8, 2.7 MiB per expert), session 38-39:
#     tokens  1      2      4      6      8      12     16     24     | 32     48
#     pairs   61.4   54.2   54.8   72.2   84.2   120.4  150.1  213.9  | 275.9  398.7
#     sorted  122.9  93.3   118.3  109.6  130.7  154.1  174.7  229.8  | 261.3  305.6
#   Qwen3-30B-A3B (E 128, top-8, 2.4 MiB per expert), session 38-39:
#     tokens  1      2      3      4      6      8      12     | 16     24
#     pairs   52.3   36.9   54.1   54.6   63.3   71.1   99.6   | 123.0  174.5
#     sorted  107.4  107.2  60.7   58.5   99.9   86.4   98.5   | 118.7  129.8
#   Mixtral (E 8, top-2, 88 MiB per expert), session 38: 1 token 78.0 / 101.9, 2 tokens
#     130.8 / 124.1 (pairs lose: one repeated expert is 88 MiB read twice).
# Pair tiles cost about one expert's read per pair (~1 µs at DeepSeek-V3, 0.8 at Qwen3:
# ≈ 3 TB/s); the sorted path's overhead grows with E (at one token: ≈ 61 µs at E 256, 55
# at 128, 24 at 8).  So the cut is on the pair tiles' weight bytes against E:
# P * expert_bytes <= 1.75 MiB * E, one token always (its top-k experts are distinct).
# It gives DeepSeek-V3 up to 20 tokens (P * bytes / E at 24 tokens: 2.06 MiB, a 7 % win
# for the pairs before session 39's schedule kernel made the sorted path ~5 % faster;
# at 32 tokens 2.75: a loss), Qwen3 up to 11 (at 12 tokens 1.77, the tie; at 16 2.36, a
# loss), Mixtral one token (2 tokens: 44 MiB, a loss).  Untimed: experts of other sizes
# (8-bit experts: twice the bytes, half the tokens), E other than 8 / 128 / 256.
PAIR_TILE_BYTES_PER_EXPERT = 1.75 * (1 << 20)


def pair_tiles(tokens: int, k: int, num_experts: int, expert_bytes: int) -> bool:
  """Whether quant_moe's Mosaic path takes a tile per pair for ``tokens`` tokens routed
  to ``k`` of ``num_experts`` experts of ``expert_bytes`` each (gate_up + down weights,
  scales and zero points): one token always; else while the pair tiles' weight reads,
  T * k * expert_bytes, are at most 1.75 MiB per expert of the layer
  (:data:`PAIR_TILE_BYTES_PER_EXPERT`, fitted to the measurements above it).
  HUMMING_JAX_MOE_PAIR_TOKENS=N: up to N tokens, 0: never -- read while tracing, for
  device A/Bs."""
  forced = tuning.env_int("HUMMING_JAX_MOE_PAIR_TOKENS", -1)
  if forced >= 0:
    return tokens <= forced
  return tokens == 1 or tokens * k * expert_bytes <= PAIR_TILE_BYTES_PER_EXPERT * num_experts


def _quant_moe_pairs(gate_up_params: QuantizedWeight, down_params: QuantizedWeight,
                     x: jax.Array, topk_weights: jax.Array, topk_ids: jax.Array,
                     activation: Activation, *, interpret: bool) -> jax.Array:
  """quant_moe on Mosaic-prepared stacks with a tile per (token, slot) pair p = t * k + j
  (``grouped_wna16_mgpu.run_pairs``): what the sorted path spends around the two GEMMs at
  decode -- the sort, the alignment scatters, the schedule scan over E, the row gathers
  -- is gone; the tiles come straight from the ids.  Pair p's gate_up tile reads x rows
  from 8 * (t // 8) (token t in slot t % 8) and writes hidden rows [8p, 8p + 8); its down
  tile reads those rows back, so the pair's output row is 8p + t % 8."""
  t, k = topk_ids.shape
  e = gate_up_params.shape[0]
  bm = grouped_wna16_mgpu.PAIR_BLOCK_M  # rows per pair tile, x tiles from multiples of it
  pairs = t * k
  token = np.arange(pairs) // k
  ids = topk_ids.reshape(-1)
  run = lambda p, a, first: grouped_wna16_mgpu.run_pairs(p, a, ids, first,
                                                          interpret=interpret)
  hid = run(gate_up_params, x, bm * (token // bm))
  ys = run(down_params, glu(hid, activation), bm * np.arange(pairs))
  # the pair's row: 8p + t % 8; out-of-range ids (their tiles unwritten) read zero
  row = jnp.where((ids >= 0) & (ids < e), bm * np.arange(pairs) + token % bm, ys.shape[0])
  return _weighted_rows(ys, topk_weights, row).astype(x.dtype)


def _gate_up_quantized_first(params: QuantizedWeight, x: jax.Array, r: SortedTokens,
                             backend: ops.Backend) -> jax.Array | None:
  """The gate_up GEMM of experts on the grouped fp8-MMA route (W4A8 MXFP4) whose
  activation scales are per token or static: the T tokens quantized once, then their e4m3
  codes and scales gathered into expert order -- the operands of the T*k gathered rows
  (bit for bit where both take the same pre-pass; from 512 rows the gathered rows take
  the one-pass Pallas one, whose float32 division may round a code one step apart from
  XLA's: H200 session 27, DeepSeek-V3 64 tokens, still 0 codes differing), for 1/k of the
  pre-pass and a 1-byte row gather instead of a 2-byte one
  (``grouped_wnam_mgpu.quantizes_rows_alone``).  H200 session 22: bit-equal to the rows'
  gather (codes, scales and layer output; DeepSeek-V3, 64 tokens), layer walls at
  DeepSeek-V3 16 / 64 / 1024 tokens 159.5 / 313.6 / 731.9 -> 160.2 / 314.4 / 701.9 us
  (NOTES_moe.md).  On by default; HUMMING_JAX_MOE_QUANTIZE_FIRST=0 gathers the rows.  None
  where it is off or does not apply."""
  if (x.dtype not in (jnp.bfloat16, jnp.float16)
      or not tuning.env_flag("HUMMING_JAX_MOE_QUANTIZE_FIRST", True)):
    return None
  b, kernel = ops.backend_and_kernel(params, x.dtype, backend, grouped=True)
  if b == "xla" or kernel.name != grouped_wnam_mgpu.FAMILY:
    return None
  p = ops.in_layout_of(kernel, params)
  if not grouped_wnam_mgpu.quantizes_rows_alone(p):
    return None
  codes, scales = grouped_wnam_mgpu.fp8_operands(x, p, interpret=b == "interpret")
  return grouped_wnam_mgpu.run_quantized(
      p, jnp.take(codes, r.token_of_row, axis=0), jnp.take(scales, r.token_of_row, axis=0),
      r.group_sizes, out_dtype=x.dtype, interpret=b == "interpret")


def _aligned_mosaic(gate_up_params, down_params, x, resolved_backend: str) -> bool:
  """Both expert stacks prepared for the Mosaic grouped kernel, 16-bit tokens, a kernel
  backend: quant_moe runs them on tile-aligned segments, or at decode a tile per pair."""
  fam = grouped_wna16_mgpu.FAMILY
  return (all(registry.layout_family(p.layout) == fam for p in (gate_up_params, down_params))
          and x.dtype in (jnp.bfloat16, jnp.float16) and resolved_backend != "xla")
