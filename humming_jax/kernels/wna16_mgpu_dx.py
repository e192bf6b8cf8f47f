"""dx = dy . W^T on the WnA16 Mosaic layout, in one Pallas-Triton pass: training's backward
at small M (a LoRA step over a frozen quantized base, decode-sized batches), dense or over
stacked experts.  The default for dense M <= :data:`DEFAULT_MAX_M` (1.9-2.2x the XLA
route's speed on the H200 / H100, session 46); stacked experts and dense M up to
:data:`MAX_M` with HUMMING_JAX_DX_KERNEL=1 (:func:`applies`).

Why a kernel: the backward differentiates ``reference.dense_gradient_reference``, whose
cotangent of x is XLA's dequantization of W to x's dtype and then a GEMM.  H200 session
41, int4 g128 zp 8192^2, M = 16: the dequantization fusion 80.4 us (it writes 134 MB of
bf16 W and reads 33 MB of codes) and the GEMM 39.2, against the forward kernel's 14.4.
Here the codes are read once, in their own orientation, and never written back.

How: the layout's (Kp / bk, Np, bk) codes are W^T blocked by K tiles -- tile t is the
(Np, bk) slab W[t bk : (t + 1) bk, :]^T, contiguous -- so
``dx[:, tile t] = dy (M, Np) @ W^T-slab (Np, bk)`` reads each slab along N, the
reduction axis, in the order it is stored.  A program owns one K tile (or a row block of
it) and a contiguous share of N (``splits`` shares: float32 partials summed by XLA);
per chunk of ``block_n`` columns of N it loads the chunk's 32-bit words, takes plane j of
each word (the codes at bit offset bits * j: 32 / bits planes; the fp8-MMA layout ":p8"
keeps each sign apart, one more shift) with a shift and a mask,
decodes it with the format's own decode, applies the zero point and the scale in float32
and rounds to dy's dtype -- the same value, bit for bit, as ``registry.dequantize(params,
dy.dtype)`` -- and multiplies it into that plane's (block_m, bk * bits / 32)
accumulator on the tensor cores.  Plane j of word w holds one K position of the tile per
word (:func:`plane_positions`): XLA puts the columns back in K order with the split sum.

Stacked experts (the grouped layouts; ``quant_ragged_dot`` and ``quant_moe``'s backwards):
rows sorted by expert, one program per row tile of one expert (``grouped_wna16.tile_at``,
as the forward's Triton grouped kernel: each program finds its tile from the group sizes),
reading that expert's slab; stores masked to the tile's own rows, the rows past
sum(group_sizes) written as zeros.

The XLA reference beside it is :func:`reference` (the backward's own VJP, which it
replaces); tests compare the two on fresh random inputs in the interpreter (and the
weights bit for bit, through one-hot rows of dy), and on the H200 against the float32
product rounded once (session 46: M = 1 / 16 / 128, five formats; grouped at
Qwen3-30B-A3B's gate_up).  Second derivatives through a backward that holds it take
:func:`reference`'s tangent, and a vmap folds its rows into one launch
(:func:`_linear_run`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from humming_jax import autodiff, formats
from humming_jax.quantize import QuantizedWeight
from humming_jax.kernels import grouped_wna16, mgpu_convert, registry, tuning, wna16_mgpu

# The families whose prepared codes this kernel reads: the WnA16 Mosaic layout, the W4A8 /
# W4A4 view of the same layout (``wnam_mgpu``: its activation quantization passes the
# gradient straight through, so its dx is dy . W^T too), and their stacks of experts.
FAMILIES = ("wna16_mgpu", "wnam_mgpu")
GROUPED_FAMILIES = ("grouped_wna16_mgpu", "grouped_wnam_mgpu")
# Largest M (dense), or expected rows per active expert (stacked), the backward routes
# here with HUMMING_JAX_DX_KERNEL=1 (:func:`applies`): past it each extra row tile decodes
# the codes again.
MAX_M = 128
# Largest dense M it takes by default (the switch unset): one row tile (MAX_BLOCK_M).
# Session 46, int4 g128 zp 8192^2, CUPTI kernel time (benchmarks/probe_grad.py; XLA route
# -> kernel), dx and in brackets the whole value_and_grad:
#   H200: M = 1 120.9 -> 62.5 (136.9 -> 76.9); M = 16 122.8 -> 63.3 (139.6 -> 79.4);
#         M = 128 124.6 -> 122.9 (162.4 -> 169.3: two row tiles decode the codes twice,
#         a loss).
#   H100 (the H200 was not lent for it): M = 32 141.7 -> 64.8 (162.1 -> 82.9); M = 64
#         142.3 -> 75.8 (167.0 -> 100.2).
DEFAULT_MAX_M = 64
BLOCK_N = 128  # N (the reduction) per chunk: the dot's K dimension
MAX_BLOCK_M = 64
MIN_PROGRAMS = 264  # two per SM of an H200 (132): splits of N are added up to this


def unsupported_reason(params: QuantizedWeight, dy: jax.Array,
                       group_sizes: jax.Array | None = None) -> str | None:
  """Why this kernel does not compute ``dy . W^T`` for ``params`` (and, for stacked
  experts, ``group_sizes``) (None: it does)."""
  layout = params.layout
  family = registry.layout_family(layout)
  stacked = params.num_experts is not None
  if family not in (GROUPED_FAMILIES if stacked else FAMILIES):
    return (f"params.layout={layout!r}: expected one of the "
            f"{GROUPED_FAMILIES if stacked else FAMILIES} layouts")
  if stacked != (group_sizes is not None):
    return (f"group_sizes: expected (E,) group sizes with stacked experts and none with "
            f"dense params; got {None if group_sizes is None else group_sizes.shape} for "
            f"params of shape {params.shape}")
  if stacked and group_sizes.shape != (params.num_experts,):
    return f"group_sizes.shape={group_sizes.shape}: expected ({params.num_experts},)"
  if params.codes.ndim != 3 + stacked:
    return (f"params.codes.shape={params.codes.shape}: expected the "
            f"{'(E, ' if stacked else '('}Kp / bk, Np, bk) tiles")
  if params.input_perm is not None:
    return "params.input_perm (act-order rows): dx would need the inverse gather"
  fmt = params.spec.weight_format
  if fmt.kind not in ("int", "uint") and fmt.name not in (wna16_mgpu.FP4, wna16_mgpu.FP8):
    return f"weight={params.spec.weight!r}: integer, fp4 e2m1 or fp8 e4m3 codes only"
  if params.codes.dtype not in (jnp.int4, jnp.int8, jnp.float8_e4m3fn):
    return (f"params.codes.dtype={params.codes.dtype}: expected int4 / int8 / "
            f"float8_e4m3fn codes")
  if dy.dtype not in (jnp.bfloat16, jnp.float16):
    return f"dy.dtype={dy.dtype}: expected bfloat16 / float16"
  n = params.shape[-1]
  if dy.ndim != 2 or dy.shape[1] != n:
    return f"dy.shape={dy.shape}: expected (M, N={n})"
  t, np_, bk = params.codes.shape[-3:]
  bits = wna16_mgpu.code_bits(params.spec)  # the stored codes' (carried formats: wider)
  if bk * bits // 32 < 16:
    return (f"K tile bk={bk} of {bits}-bit codes (groups of {bk}): {bk * bits // 32} words "
            f"per tile row, the dot needs 16 output columns per plane")
  if np_ % 64:
    return f"Np={np_}: expected a multiple of 64 (the layout's column block)"
  try:
    _row_views(bk, bits, wna16_mgpu.code_order(layout), groups_per_tile(params))
  except ValueError as e:
    return str(e)
  return None


def applies(params: QuantizedWeight, dy: jax.Array,
            group_sizes: jax.Array | None = None) -> bool:
  """Whether a backward takes this kernel for ``dy``.

  HUMMING_JAX_DX_KERNEL unset: dense params at M <= :data:`DEFAULT_MAX_M` (where it
  timed 1.9-2.2x faster than the XLA route); stacked experts not (the MoE layer's backward
  on it is not yet timed, and its gradient's distance from the XLA route's is being
  measured: benchmarks/NOTES.md, session 46).  "1": dense M <= :data:`MAX_M` and stacked
  experts with at most that many expected rows per active expert.  "0": never."""
  # read first, so that a bad value is named wherever the backward is traced
  switch = tuning.env_flag("HUMMING_JAX_DX_KERNEL", None)  # None: unset
  if switch is False or dy.ndim != 2 or not dy.shape[0]:
    return False
  if switch is None and (params.num_experts is not None or dy.shape[0] > DEFAULT_MAX_M):
    return False
  rows = (dy.shape[0] if params.num_experts is None
          else grouped_wna16.rows_per_active_expert(dy.shape[0], params.num_experts))
  return rows <= MAX_M and unsupported_reason(params, dy, group_sizes) is None


def groups_per_tile(params: QuantizedWeight) -> int:
  """Scale rows per K tile (per channel: the one column-scale row, 1)."""
  if wna16_mgpu.column_scaled(params.spec):
    return 1
  return params.codes.shape[-1] // wna16_mgpu.scale_k(params.spec)


def plane_positions(bk: int, bits: int, order: str) -> np.ndarray:
  """(planes, words) K positions within a tile of the code that plane j of 32-bit word w
  holds (:func:`_plane_code`).  K order: code j of the word, stored position w * per + j
  (per = 32 / bits codes per word).  ":pk": the K position ``mgpu_convert.permute_k``
  (an involution) stored there.  ":p8": word q of each run of 32 (4 words) holds the run's
  K positions 4 q + j (planes 0..3) and 16 + 4 q + j - 4 (planes 4..7)."""
  per = 32 // bits
  stored = np.arange(bk // per)[None, :] * per + np.arange(per)[:, None]
  if order == "pk":
    return np.asarray(mgpu_convert.permute_k(np.arange(bk)))[stored]
  if order == "p8":
    run, p = stored // 32, stored % 32
    q, j = p // 8, p % 8
    return run * 32 + 16 * (j // 4) + 4 * q + j % 4
  return stored


def _plane_code(w: jax.Array, j: int, bits: int, order: str) -> jax.Array:
  """The ``bits``-bit codes of plane j of int32 words (:func:`plane_positions`): bits
  bits * j .. bits * j + bits - 1, but for ":p8", whose e2m1 magnitudes sit there (bits
  4 j .. 4 j + 2) and whose signs sit in bit 8 j + 7 (planes 0..3) or 8 (j - 4) + 3
  (planes 4..7): ``mgpu_convert.p8_store``'s regrouping, one bit per code moved back."""
  if order != "p8":
    return (w >> (bits * j)) & ((1 << bits) - 1) if j else w & ((1 << bits) - 1)
  sign = 8 * j + 7 if j < 4 else 8 * (j - 4) + 3
  return (((w >> sign) & 1) << 3) | ((w >> (4 * j)) & 7)


def _row_views(bk: int, bits: int, order: str, groups: int) -> tuple[int, tuple]:
  """How each plane meets the tile's scale rows: ``(h_count, plane_h)``.  The rows are
  read as (groups / h_count, h_count) and plane j reads column ``plane_h[j]`` of it, one
  row per words * h_count / groups consecutive words: K order, and groups of 32 or more
  in the ":pk" and ":p8" orders (every run of 32 codes, 4 words, within one group):
  h_count 1; groups of 16 in the ":pk" order alternate rows within each run: h_count 2,
  plane j reads row 2 r + j // 4."""
  rows = plane_positions(bk, bits, order) // (bk // groups)  # (planes, words)
  words = rows.shape[1]
  for hc in (1, 2):
    if groups % hc:
      continue
    span = words * hc // groups  # consecutive words per row the plane reads
    plane_h = tuple(int(r[0]) % hc for r in rows)
    if all(np.array_equal(r, hc * (np.arange(words) // span) + h)
           for r, h in zip(rows, plane_h)):
      return hc, plane_h
  raise ValueError(f"groups={groups} of a {bk}-code tile ({bits}-bit, {order!r} order): "
                   f"no supported row pattern")


def _kernel(*refs, fmt, bits: int, order: str, hc: int, plane_h: tuple, has_zeros: bool,
            has_global: bool, column: bool, chunks: int, block_n: int, block_m: int,
            dtype, grouped: dict | None):
  gs_ref = refs[0] if grouped else None
  dy_ref, w_ref, s_ref, *rest = refs[1:] if grouped else refs
  z_ref = rest.pop(0) if has_zeros else None
  g_ref = rest.pop(0) if has_global else None
  (o_ref,) = rest
  planes = 32 // bits
  words = w_ref.shape[-1]
  if grouped:  # this program's row tile: one expert's rows [start, end) (grouped_wna16)
    e, start, end, kind = grouped_wna16.tile_at(gs_ref[...], grouped["m"], block_m,
                                                pl.program_id(0))
    e = jnp.minimum(e, grouped["experts"] - 1)  # padded (empty) experts own no tile
    rows = pl.ds(start, block_m)
    ld = lambda ref, *idx: ref[(e, *idx)]  # from the expert's slice of a stacked operand
  else:
    rows = slice(None)
    ld = lambda ref, *idx: ref[idx]

  def per_word(rows):  # (rows, bn) -> (bn, words): each row over its consecutive words
    r, bn = rows.shape
    if r == 1:
      return jnp.broadcast_to(rows.T, (bn, words))
    return jnp.broadcast_to(rows.T[:, :, None], (bn, r, words // r)).reshape(bn, words)

  def chunk(c, accs):
    n0 = pl.multiple_of(c * block_n, block_n)
    cols = pl.ds(n0, block_n)
    dy = dy_ref[rows, cols]
    w = ld(w_ref, cols, slice(None))  # (bn, words) int32
    g = ld(g_ref, slice(None), cols) if has_global else None  # (1, bn) float32
    scale, zero = {}, {}  # per row view h: (bn, words) float32
    for h in sorted(set(plane_h)):
      s = ld(s_ref, slice(None), h, cols).astype(jnp.float32)  # (groups / hc, bn)
      if has_global and not column:  # code * (s * g): quantize.decode_scales' order
        s = s * g
      scale[h] = per_word(s)
      if has_zeros:
        zero[h] = per_word(ld(z_ref, slice(None), h, cols).astype(jnp.float32))
    out = []
    for j in range(planes):
      code = _plane_code(w, j, bits, order)
      v = fmt.decode(code, check_nan=fmt.has_nan)  # float32, exact; e4m3's NaN kept
      if has_zeros:
        v = v - zero[plane_h[j]]
      v = v * scale[plane_h[j]]
      if has_global and column:  # (code * s) * g: the column-scale reader's order
        v = v * jnp.broadcast_to(g.T, v.shape)
      out.append(accs[j] + jnp.dot(dy, v.astype(dtype), preferred_element_type=jnp.float32))
    return tuple(out)

  def compute():
    accs = tuple(jnp.zeros((block_m, words), jnp.float32) for _ in range(planes))
    return jax.lax.fori_loop(0, chunks, chunk, accs)

  if not grouped:
    for j, acc in enumerate(compute()):
      o_ref[:, pl.ds(j * words, words)] = acc
    return
  row_ok = jnp.broadcast_to((start + jnp.arange(block_m, dtype=jnp.int32) < end)[:, None],
                            (block_m, words))

  @pl.when(kind == 1)
  def _compute():
    for j, acc in enumerate(compute()):
      plt.store(o_ref.at[rows, pl.ds(j * words, words)], acc, mask=row_ok)

  @pl.when(kind == 0)  # rows past sum(group_sizes): zeros, as ragged_dot's
  def _zero_fill():
    for j in range(planes):
      plt.store(o_ref.at[rows, pl.ds(j * words, words)], jnp.zeros((block_m, words),
                                                                   jnp.float32), mask=row_ok)


def _splits(programs: int, chunks: int) -> int:
  """Shares of N per (row block, K tile): a divisor of the chunk count, the least one
  that makes MIN_PROGRAMS programs (or every chunk its own share)."""
  for s in range(1, chunks + 1):
    if chunks % s == 0 and programs * s >= MIN_PROGRAMS:
      return s
  return chunks


def block_n_for(np_: int) -> int:
  """N per chunk: :data:`BLOCK_N`, or 64 where Np (a multiple of 64) is not a multiple."""
  return BLOCK_N if np_ % BLOCK_N == 0 else 64


def grouped_block_m(m: int, num_experts: int) -> int:
  """Rows per tile of the grouped launch: the expected rows per active expert, rounded up
  to 16 / 32 / 64 (each tile decodes its expert's codes once)."""
  rows = grouped_wna16.rows_per_active_expert(m, num_experts)
  return 16 if rows <= 16 else 32 if rows <= 32 else MAX_BLOCK_M


@functools.partial(jax.jit, static_argnames=("interpret", "splits"))
def run(params: QuantizedWeight, dy: jax.Array, group_sizes: jax.Array | None = None, *,
        interpret: bool = False, splits: int | None = None) -> jax.Array:
  """(M, N) 16-bit ``dy`` x prepared params -> dx = dy . W^T, (M, K) in dy's dtype, W
  rounded to dy's dtype as ``registry.dequantize(params, dy.dtype)`` rounds it (float32
  accumulation).

  Dense params (``wna16_mgpu`` / ``wnam_mgpu`` layouts) or, with ``group_sizes`` (E,),
  stacked experts (their grouped layouts) and dy's rows sorted by expert, as
  ``lax.ragged_dot``'s: each row against its expert's W^T, rows past sum(group_sizes)
  zero.  ``splits``: shares of N per K tile (default: enough programs for the GPU)."""
  if (why := unsupported_reason(params, dy, group_sizes)) is not None:
    raise ValueError(f"wna16_mgpu_dx.run: {why}")
  spec = params.spec
  experts = params.num_experts
  k, n = params.shape[-2:]
  t, np_, bk = params.codes.shape[-3:]
  bits = wna16_mgpu.code_bits(spec)
  per = 32 // bits
  words = bk // per
  m = dy.shape[0]
  if m == 0:
    return jnp.zeros((0, k), dy.dtype)
  stack = () if experts is None else (experts,)
  block_m = (grouped_block_m(m, experts) if experts
             else min(MAX_BLOCK_M, -(-m // 16) * 16))
  if experts:  # one program per row tile; rows from each tile's own start (masked stores)
    row_tiles = grouped_wna16.max_tiles(m, experts, block_m)
    mo = m + block_m  # tile rows past M stay inside the (unmasked) dy loads
  else:
    mo = -(-m // block_m) * block_m
    row_tiles = mo // block_m
  block_n = block_n_for(np_)
  chunks = np_ // block_n
  splits = splits or _splits(row_tiles * t, chunks)
  if chunks % splits:
    raise ValueError(f"splits={splits}: must divide the {chunks} chunks of N")
  per_split = chunks // splits
  ns = per_split * block_n
  dyp = jnp.pad(dy, ((0, mo - m), (0, np_ - n)))
  w = jax.lax.bitcast_convert_type(params.codes.reshape(*stack, t, np_, words, per),
                                   jnp.int32)
  groups = groups_per_tile(params)
  column = wna16_mgpu.column_scaled(spec)
  order = wna16_mgpu.code_order(params.layout)
  hc, plane_h = _row_views(bk, bits, order, groups)
  lead = (experts,) if experts else ()  # a stack's operands: every expert in the block
  zero_lead = (0,) if experts else ()

  def tiled(a, tile_axis: bool):  # (*stack, rows, Np) scale-like rows -> per-tile views
    a = a.reshape(*stack, t if tile_axis else 1, groups // hc, hc, np_)
    return a, pl.BlockSpec((*lead, None, groups // hc, hc, ns),
                           lambda i, kt, sp: (*zero_lead, kt if tile_axis else 0, 0, 0, sp))

  s, s_spec = tiled(params.scales, not column)
  operands = [dyp, w, s]
  in_specs = [pl.BlockSpec((mo, ns), lambda i, kt, sp: (0, sp)) if experts
              else pl.BlockSpec((block_m, ns), lambda i, kt, sp: (i, sp)),
              pl.BlockSpec((*lead, None, ns, words), lambda i, kt, sp: (*zero_lead, kt, sp, 0)),
              s_spec]
  has_zeros = params.zeros is not None
  if has_zeros:
    z, z_spec = tiled(params.zeros, True)
    operands.append(z)
    in_specs.append(z_spec)
  has_global = params.global_scale is not None
  if has_global:
    operands.append(params.global_scale.reshape(*stack, 1, np_).astype(jnp.float32))
    in_specs.append(pl.BlockSpec((*lead, 1, ns),
                                 lambda i, kt, sp: (*zero_lead, 0, sp)))
  grouped = None
  if experts:
    gs = grouped_wna16.pow2_experts(group_sizes)  # each program finds its own tile
    operands.insert(0, gs)
    in_specs.insert(0, pl.BlockSpec(gs.shape, lambda i, kt, sp: (0,)))
    grouped = dict(m=m, experts=experts)
  fmt = (formats.get_format(f"int{bits}") if spec.weight_format.kind in ("int", "uint")
         else spec.weight_format)  # stored as signed codes of the carrier (prepare)
  kernel = functools.partial(
      _kernel, fmt=fmt, bits=bits, order=order, hc=hc, plane_h=plane_h, has_zeros=has_zeros,
      has_global=has_global, column=column, chunks=per_split, block_n=block_n,
      block_m=block_m, dtype=dy.dtype, grouped=grouped)
  if experts:  # every row tile writes its own rows of the whole block
    out_spec = pl.BlockSpec((None, mo, None, bk), lambda i, kt, sp: (sp, 0, kt, 0))
  else:
    out_spec = pl.BlockSpec((None, block_m, None, bk), lambda i, kt, sp: (sp, i, kt, 0))
  out = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((splits, mo, t, bk), jnp.float32),
      grid=(row_tiles, t, splits),
      in_specs=in_specs,
      out_specs=out_spec,
      compiler_params=plt.CompilerParams(num_warps=4, num_stages=3),
      interpret=interpret,
      name=(f"{'grouped_' if experts else ''}wna16_mgpu_dx_b{bits}"
            + ("" if order == "k" else f"_{order}")),
  )(*operands)
  # (splits, Mo, t, planes * words) -> (M, K) in K order: one XLA fusion with the sum
  k_order = np.argsort(plane_positions(bk, bits, order).reshape(-1))
  dx = out.sum(axis=0)[:, :, k_order]
  return dx.reshape(mo, t * bk)[:m, :k].astype(dy.dtype)


def cotangent(params: QuantizedWeight, x: jax.Array, dy: jax.Array,
              group_sizes: jax.Array | None = None, *, interpret: bool) -> jax.Array | None:
  """The cotangent of x for quant_dense's / quant_ragged_dot's backward (``x_cotangent``
  of ``autodiff.with_reference_vjp``) from :func:`run` where :func:`applies` and x is
  dy's 16-bit dtype -- then the reference's VJP computes the same, dy . W^T with W
  rounded to x's dtype -- else None (the reference's VJP runs)."""
  if x.dtype != dy.dtype or not applies(params, dy, group_sizes):
    return None
  return _linear_run(params, dy, group_sizes, interpret)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _linear_run(params: QuantizedWeight, dy: jax.Array, group_sizes: jax.Array | None,
                interpret: bool) -> jax.Array:
  """:func:`run` inside the backward, for JAX's other transformations (a Pallas call has
  no derivative, transpose or efficient batching rule of its own):
  - its tangent is :func:`reference`'s (the XLA decode and GEMM), taken with respect to dy
    and the params alike: forward over reverse (``jax.hessian``, Hessian-vector
    products) and reverse over reverse (a gradient of a gradient: XLA can transpose it)
    both work, and a tangent of the params is not dropped;
  - under ``vmap`` (per-example gradients, ``jax.hessian``'s tangents) dense rows are
    folded into one M (:func:`_batched_dense`): W is decoded once, not once per example.
  """
  if group_sizes is None:
    return _batched_dense(params, dy, interpret)
  return run(params, dy, group_sizes, interpret=interpret)


def _linear_run_jvp(interpret, primals, tangents):
  params, dy, group_sizes = primals
  out = _linear_run(params, dy, group_sizes, interpret)
  return out, autodiff.tangent_of(lambda p, d: reference(p, d, group_sizes), (params, dy),
                                  tangents[:2], out)


_linear_run.defjvp(_linear_run_jvp, symbolic_zeros=True)


def _batched_dense(params: QuantizedWeight, dy: jax.Array, interpret: bool) -> jax.Array:
  """Dense :func:`run` whose ``vmap`` folds the batch into M: rows of every example in
  one launch where :func:`applies` to them all, else :func:`reference` (XLA's decode and
  one GEMM); batched params (a vmap over weights) take the reference per example."""

  @jax.custom_batching.custom_vmap
  def dense(params, dy):
    return run(params, dy, interpret=interpret)

  @dense.def_vmap
  def _(axis_size, in_batched, params, dy):
    params_batched, dy_batched = in_batched
    if any(jax.tree.leaves(params_batched)):
      axes = jax.tree.map(lambda b: 0 if b else None, params_batched)
      return jax.vmap(reference, in_axes=(axes, 0 if dy_batched else None))(params, dy), True
    # (JAX calls this rule only with something batched: params above, else dy)
    rows = dy.reshape(-1, dy.shape[-1])
    folded = (_batched_dense(params, rows, interpret) if applies(params, rows)
              else reference(params, rows))
    return folded.reshape(*dy.shape[:-1], folded.shape[-1]), True
  return dense(params, dy)


def reference(params: QuantizedWeight, dy: jax.Array,
              group_sizes: jax.Array | None = None) -> jax.Array:
  """What :func:`run` computes, as the backward computes it without this kernel: the
  cotangent of x of ``reference.dense_gradient_reference`` (dense) or
  ``moe.ragged_dot_gradient_reference`` (stacked) -- W decoded from its layout to dy's
  dtype, a 16-bit GEMM with float32 accumulation (the VJP of a linear map: the same at
  any x)."""
  from humming_jax import moe  # noqa: PLC0415 (moe imports this module)
  from humming_jax.kernels import reference as xla  # noqa: PLC0415
  x = jnp.zeros((dy.shape[0], params.shape[-2]), dy.dtype)
  if group_sizes is None:
    f = lambda x: xla.dense_gradient_reference(params.replace(bias=None), x)
  else:
    f = lambda x: moe.ragged_dot_gradient_reference(params.replace(bias=None), x,
                                                     group_sizes)
  return jax.vjp(f, x)[1](dy)[0]
