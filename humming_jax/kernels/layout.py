"""The kernel weight layout ("slab layout") and its transform from the canonical layout.

Why: in the canonical layout a uint32 word holds 32/bits *consecutive* K rows, so
unpacking slot i of a word tile gives rows k = i, i + P, i + 2P, ... -- strided in K, which
would force a strided read of the activations.  The slab layout instead interleaves a K tile
of ``block_k`` rows so that slot i of word-row j holds row ``i * (block_k / P) + j``: unpacking
slot i of a whole word tile yields a *contiguous* K slab, which pairs with a contiguous
slice of x and a single scale row.  Prepared once ("transform"); never per call.

Widths that do not divide 32 (3, 5, 6, 7 bits) are split into bit planes of 4, 2 and 1
bits (7 = 4 + 2 + 1), each plane in the slab layout; storage stays exactly ``bits`` per
weight.  Signed integer codes are stored offset-binary (sign bit flipped), so the kernel's
dequantizer is one unsigned decode minus a constant (see formats.uint_to_f32).

Tile geometry: ``num_slabs = 32 / min(plane bits)`` slabs of ``slab`` rows per K tile,
``block_k = num_slabs * slab``.  A slab never crosses a scale group (``slab`` divides the
group size), so each slab's partial product takes one scale row.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

PLANES = {1: (1,), 2: (2,), 3: (2, 1), 4: (4,), 5: (4, 1), 6: (4, 2), 7: (4, 2, 1), 8: (8,)}


@dataclasses.dataclass(frozen=True)
class SlabLayout:
  """Geometry of the slab layout for ``bits``-bit codes with ``slab`` rows per slab."""

  bits: int
  slab: int
  n_align: int = 64  # N is padded to a multiple of this

  @property
  def planes(self) -> tuple[int, ...]:
    return PLANES[self.bits]

  @property
  def num_slabs(self) -> int:
    return 32 // min(self.planes)

  @property
  def block_k(self) -> int:
    return self.num_slabs * self.slab

  @property
  def rows_per_tile(self) -> int:
    """uint32 rows one K tile occupies (all planes)."""
    return self.block_k * self.bits // 32

  def plane_rows(self, p: int) -> int:
    return self.block_k * self.planes[p] // 32

  def plane_row_offset(self, p: int) -> int:
    return sum(self.plane_rows(q) for q in range(p))

  def plane_bit_offset(self, p: int) -> int:
    return sum(self.planes[:p])

  def locate(self, p: int, s: int) -> tuple[int, int]:
    """(row offset within the tile, bit shift within the word) of slab s in plane p."""
    rows = self.plane_rows(p)  # = block_k / (32 / plane bits)
    first_k = s * self.slab
    slot, row = divmod(first_k, rows)
    return self.plane_row_offset(p) + row, slot * self.planes[p]

  @property
  def name(self) -> str:
    return f"slab{self.slab}"

  def k_of_rows(self, rows: int) -> int:
    """The padded K held by ``rows`` uint32 rows of packed codes (the inverse of pack)."""
    return rows // self.rows_per_tile * self.block_k

  def padded_k(self, k: int) -> int:
    return -(-k // self.block_k) * self.block_k

  def padded_n(self, n: int) -> int:
    return -(-n // self.n_align) * self.n_align

  # ---- transform --------------------------------------------------------------------------
  def pack(self, codes: jax.Array) -> jax.Array:
    """(Kp, Np) uint codes (Kp a multiple of block_k) -> (Kp/block_k * rows_per_tile, Np)."""
    kp, n = codes.shape
    t = kp // self.block_k
    c = codes.astype(jnp.uint32).reshape(t, self.block_k, n)
    tiles = []
    for p, pb in enumerate(self.planes):
      per_word = 32 // pb
      plane = (c >> self.plane_bit_offset(p)) & ((1 << pb) - 1)
      plane = plane.reshape(t, per_word, self.block_k // per_word, n)  # k = slot*rows + row
      words = jnp.zeros((t, self.block_k // per_word, n), jnp.uint32)
      for slot in range(per_word):
        words = words | (plane[:, slot] << (slot * pb))
      tiles.append(words)
    return jnp.concatenate(tiles, axis=1).reshape(t * self.rows_per_tile, n)

  def unpack(self, words: jax.Array, transposed: bool = False) -> jax.Array:
    """Inverse of :meth:`pack`: -> (Kp, Np) uint8 codes.

    ``transposed``: -> (Np, Kp), transposing the packed words (32 / bits codes each)
    before unpacking instead of the codes after: fewer bytes through the transpose."""
    rows, n = words.shape
    t = rows // self.rows_per_tile
    if transposed:  # (Np, K tiles, word rows): code axes are (tile, slot, row) either way
      w, slot_axis, shape = words.T.reshape(n, t, self.rows_per_tile), 2, (n, t, self.block_k)
    else:
      w, slot_axis, shape = words.reshape(t, self.rows_per_tile, n), 1, (t, self.block_k, n)
    codes = jnp.zeros(shape, jnp.uint32)
    for p, pb in enumerate(self.planes):
      per_word = 32 // pb
      r0 = self.plane_row_offset(p)
      pw = jax.lax.slice_in_dim(w, r0, r0 + self.plane_rows(p), axis=2 if transposed else 1)
      slots = [(pw >> (slot * pb)) & ((1 << pb) - 1) for slot in range(per_word)]
      plane = jnp.stack(slots, axis=slot_axis).reshape(shape)
      codes = codes | (plane << self.plane_bit_offset(p))
    out = (n, t * self.block_k) if transposed else (t * self.block_k, n)
    return codes.reshape(out).astype(jnp.uint8)


def choose_slab(bits: int, group: int | None, k: int | None = None) -> int:
  """Slab rows: at most 64 (small tiles pipeline better), dividing the scale group.

  ``k`` (optional; None keeps the K-independent choice): also fit the K tile to K -- among
  the slabs allowed above, take the one with the least K padding (ties: the larger slab),
  e.g. int4 g128 with K=256 gets slab 32 (K tile 256) instead of slab 64 (K tile 512,
  which would double the weight bytes and MACs)."""
  if k is not None:
    best = choose_slab(bits, group)
    num_slabs = 32 // min(PLANES[bits])
    s = best
    while s % 2 == 0 and s // 2 >= 16 and (not group or group % (s // 2) == 0):
      s //= 2
      if -(-k // (num_slabs * s)) * num_slabs * s < -(-k // (num_slabs * best)) * num_slabs * best:
        best = s
    return best
  s = 64
  if group:
    while group % s:
      s //= 2
  # Keep the K tile (num_slabs * slab) <= 1024 rows for odd widths (32 slabs).
  num_slabs = 32 // min(PLANES[bits])
  while num_slabs * s > 1024 and s > 16:
    s //= 2
  return max(s, 16) if not group or group % 16 == 0 else s


def layout_name(family: str, layout: SlabLayout) -> str:
  return f"{family}:{layout.name}:b{layout.bits}:n{layout.n_align}"


def parse_layout_name(name: str) -> tuple[str, SlabLayout]:
  family, slab, bits, n_align = name.split(":")
  return family, SlabLayout(int(bits[1:]), int(slab[4:]), int(n_align[1:]))
