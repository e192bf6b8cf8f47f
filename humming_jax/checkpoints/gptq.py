"""GPTQ (AutoGPTQ / GPTQModel / optimum) and AWQ (AutoAWQ GEMM) checkpoints.

GPTQ stores, per linear (torch (out, in) = (N, K) module):
  ``qweight`` int32 (K*bits/32, N): codes packed along K as a dense little-endian bitstream
  (3-bit codes straddle words) -- the same bitstream as our canonical layout;
  ``qzeros``  int32 (G, N*bits/32): zero points packed along N likewise;
  ``scales``  fp16 (G, N); ``g_idx`` int32 (K,) group of each input row; ``bias``.
  Checkpoint format "gptq" (v1, AutoGPTQ) stores zero points *minus one*; "gptq_v2"
  (GPTQModel) stores them as they are.  A stored 2**bits - 1 in a v1 file is AutoGPTQ's
  packing of a true zero 0 (-1 OR-ed in as 0xFFFFFFFF, which also sets every higher field
  of that word): readers disagree on it -- vLLM's and exllama's kernels add 1 with no
  modulo (zero 2**bits), some AutoGPTQ torch paths mask after adding (zero 0), and no reader
  recovers the word's higher fields.  We read it as vLLM serves it (2**bits; 8 bits: refused,
  zero points are uint8) and warn, naming the tensor.
  Dequantization: ``(code - zero) * scale``.  When every zero point is 2**(bits-1) (symmetric)
  the layer is mapped to signed ``intN`` codes (``code - 2**(bits-1)``, no zero points), else
  to ``uintN`` + uint8 zero points.
  Act-order (``desc_act``: a ``g_idx`` that is not ``k // group_size``): the rows are sorted
  by group and the order kept as the weight's ``input_perm`` (``_common.act_order``):
  ``quant_dense`` gathers x's columns by it before the kernel.

AWQ (GEMM version) stores ``qweight`` int32 (K, N/8) packed along N in the order
[0, 2, 4, 6, 1, 3, 5, 7] (nibble j of word c holds column 8c + order[j]), ``qzeros`` int32
(G, N/8) likewise, ``scales`` fp16 (G, N); zero points as they are: ``(code - zero) * scale``.
"""
from __future__ import annotations

import warnings

import numpy as np

from humming_jax.checkpoints._common import (Unit, act_order, bias_of, expect,
                                             float_scale_dtype, make_weight, spec_or_error,
                                             stream_as_canonical, unpack_stream)

_INT = (np.int32, np.uint32)
_OTHER_FORMATS = {"weight", "weight_packed", "weight_scale", "weight_zero_point",
                  "weight_scale_2", "weight_global_scale"}
AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])


def _check_parts(fmt: str, module: str, suffixes: set[str], needed) -> bool:
  if "qweight" not in suffixes:
    stray = suffixes & {"qzeros", "scales", "g_idx"}
    if stray:
      raise ValueError(f"module {module!r}: has {sorted(stray)} but no {module}.qweight "
                       f"(format {fmt!r} needs {list(needed)})")
    return False
  mixed = suffixes & _OTHER_FORMATS
  if mixed:
    raise ValueError(f"module {module!r}: mixed formats in one layer: {fmt} tensor "
                     f"{module}.qweight together with {sorted(f'{module}.{s}' for s in mixed)}")
  for s in needed:
    if s not in suffixes:
      raise ValueError(f"module {module!r}: missing tensor {module}.{s} (format {fmt!r} needs "
                       f"{', '.join(needed)})")
  return True


def _zero_point_spec(module, bits, zeros, group_size, k, scale_dtype):
  """Signed intN when all zero points are the midpoint, else uintN + zero points.

  Returns (spec, flip_sign, zeros): ``flip_sign`` says codes become ``code - 2**(bits-1)``
  in two's complement (an XOR of the top bit)."""
  half = 1 << (bits - 1)
  gran = dict(granularity="group", group_size=group_size) if group_size < k else \
      dict(granularity="channel", group_size=0)
  if np.all(zeros == half):
    spec = spec_or_error(module, weight=f"int{bits}", scale_dtype=scale_dtype, **gran)
    return spec, True, None
  spec = spec_or_error(module, weight=f"uint{bits}", zero_point=True, scale_dtype=scale_dtype,
                       **gran)
  return spec, False, zeros


def plan_gptq(module: str, suffixes: set[str], qcfg: dict,
              notes: list | None = None) -> list[Unit] | None:
  needed = ("qweight", "qzeros", "scales")
  if not _check_parts("gptq", module, suffixes, needed):
    return None
  bits = int(qcfg.get("bits", qcfg.get("w_bit", 4)))
  if bits not in (2, 3, 4, 8):
    raise ValueError(f"quantization_config.bits={bits}; GPTQ checkpoints have 2, 3, 4 or 8")
  group_size = int(qcfg.get("group_size", 128))
  fmt = str(qcfg.get("checkpoint_format", "gptq")).lower()
  if fmt not in ("gptq", "gptq_v2"):
    raise ValueError(f"quantization_config.checkpoint_format={fmt!r}; supported: 'gptq' (v1, "
                     "zero points stored minus one) and 'gptq_v2' (marlin/bitblas/ipex "
                     "repacked layouts are not read)")
  v1 = fmt == "gptq"
  keys = [f"{module}.{s}" for s in needed + tuple(s for s in ("g_idx", "bias")
                                                    if s in suffixes)]

  def build(a):
    qw = expect(f"{module}.qweight", a[f"{module}.qweight"], _INT)
    rows, n = qw.shape
    if (rows * 32) % bits:
      raise ValueError(f"tensor {module}.qweight: {rows} rows of 32 bits do not hold whole "
                       f"{bits}-bit codes")
    k = rows * 32 // bits
    g = k if group_size in (-1, 0) else group_size
    ng = -(-k // g)
    sc = a[f"{module}.scales"]
    scale_dtype = float_scale_dtype(f"{module}.scales", sc)
    expect(f"{module}.scales", sc, sc.dtype, (ng, n))
    qz = expect(f"{module}.qzeros", a[f"{module}.qzeros"], _INT, (ng, -(-n * bits // 32)))
    zeros = unpack_stream(qz, bits, n, axis=1)  # (G, N)
    if v1:  # AutoGPTQ stores zero - 1; vLLM's kernels add 1 back, no modulo
      zeros = zeros.astype(np.int32) + 1
      if zeros.max() == 1 << bits:  # a stored -1 (see the module docstring)
        g_at, n_at = np.argwhere(zeros == 1 << bits)[0]
        where = (f"tensor {module}.qzeros: group {g_at}, column {n_at} (and "
                 f"{int((zeros == 1 << bits).sum()) - 1} more) stores {(1 << bits) - 1}, "
                 f"AutoGPTQ's -1 for a zero point of 0, which also overwrote the higher "
                 f"fields of its word")
        if bits == 8:
          raise ValueError(f"{where}; read as vLLM does it is a zero point of 256, past our "
                           f"uint8 zero points: re-export the layer as gptq_v2")
        note = f"{where}; read as vLLM does: a zero point of {1 << bits}"
        if notes is None:
          warnings.warn(note, stacklevel=2)
        else:
          notes.append(note)  # load_checkpoint warns once, with every note
      zeros = zeros.astype(np.uint8)
    spec, flip, zeros = _zero_point_spec(module, bits, zeros, g, k, scale_dtype)
    bias = bias_of(module, a, n)
    packed = stream_as_canonical(qw, bits, k, flip)  # K % 32 == 0: words taken over as is
    if packed is not None:
      w = make_weight(spec, None, sc, zeros, bias=bias, packed=packed, shape=(k, n))
    else:
      codes = unpack_stream(qw, bits, k, axis=0)  # (K, N)
      codes = codes ^ np.uint8(1 << (bits - 1)) if flip else codes
      w = make_weight(spec, codes, sc, zeros, bias=bias)
    if f"{module}.g_idx" in a:
      w = act_order(module, f"{module}.g_idx", a[f"{module}.g_idx"], w)
    return {"weight": w}

  return [Unit(module, tuple(keys), build)]


def plan_awq(module: str, suffixes: set[str], qcfg: dict) -> list[Unit] | None:
  needed = ("qweight", "qzeros", "scales")
  if not _check_parts("awq", module, suffixes, needed):
    return None
  bits = int(qcfg.get("bits", qcfg.get("w_bit", 4)))
  version = str(qcfg.get("version", "gemm")).lower()
  if bits != 4 or version != "gemm":
    raise ValueError(f"AWQ checkpoint with bits={bits}, version={version!r}: only 4-bit "
                     "'gemm' packing is supported (gemv/marlin/exllama layouts are not read)")
  if qcfg.get("zero_point", True) is False:
    raise ValueError("AWQ with zero_point=False is not supported")
  group_size = int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
  keys = [f"{module}.{s}" for s in needed + (("bias",) if "bias" in suffixes else ())]

  def unpack_awq(name, words):
    w = words.view(np.uint32)
    nib = ((w[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF).astype(np.uint8)
    out = np.empty_like(nib)
    out[..., AWQ_ORDER] = nib  # nibble j -> column order[j] of its group of 8
    return out.reshape(*w.shape[:-1], w.shape[-1] * 8)

  def build(a):
    qw = expect(f"{module}.qweight", a[f"{module}.qweight"], _INT)
    k, cols = qw.shape
    n = cols * 8
    g = k if group_size in (-1, 0) else group_size
    ng = -(-k // g)
    sc = a[f"{module}.scales"]
    scale_dtype = float_scale_dtype(f"{module}.scales", sc)
    expect(f"{module}.scales", sc, sc.dtype, (ng, n))
    qz = expect(f"{module}.qzeros", a[f"{module}.qzeros"], _INT, (ng, cols))
    codes = unpack_awq(f"{module}.qweight", qw)
    zeros = unpack_awq(f"{module}.qzeros", qz)
    spec, flip, zeros = _zero_point_spec(module, 4, zeros, g, k, scale_dtype)
    codes = codes ^ np.uint8(8) if flip else codes
    return {"weight": make_weight(spec, codes, sc, zeros, bias=bias_of(module, a, n))}

  return [Unit(module, tuple(keys), build)]
