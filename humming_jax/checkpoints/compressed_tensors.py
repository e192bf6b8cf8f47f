"""compressed-tensors (llm-compressor) checkpoints.

Per quantized module (torch (N, K) = (out, in)):
  pack-quantized   ``weight_packed`` int32: codes ``q + 2**(bits-1)`` packed along K, low
                   bits first (``pack_to_int32``); compressed-tensors >= 0.18 packs a dense
                   bitstream, (N, ceil(K*bits/32)); earlier versions ``32 // bits`` codes
                   per word, (N, ceil(K / (32 // bits))) -- the same at 1 / 2 / 4 / 8 bits;
                   at 3 / 5 / 6 / 7 the shape tells them apart (``_dense_packing``);
                   ``weight_shape`` [N, K]; ``weight_scale`` (N, G) / (N, 1); asymmetric:
                   ``weight_zero_point`` packed the same way along N, holding
                   ``zp + 2**(bits-1)``.
  int-quantized    ``weight`` int8 (N, K) codes ``q`` as they are (+ ``weight_zero_point`` int8).
  float-quantized  ``weight`` float8_e4m3fn (N, K); ``weight_scale`` per channel (N, 1),
                   per tensor (1,) or per block (N/bn, K/bk) for ``block_structure=[bn, bk]``.
  nvfp4-pack-quantized  ``weight_packed`` uint8 (N, K/2) e2m1 codes, low nibble first;
                   ``weight_scale`` float8_e4m3fn (N, K/16); ``weight_global_scale`` (1,) fp32
                   stored as the *divisor*: value = e2m1 * (scale / global_scale).  We store
                   ``1 / weight_global_scale`` as our multiplicative ``s2`` (within one fp32
                   rounding of the producer's division).
  mxfp4-pack-quantized / mxfp6-pack-quantized / mxfp8-quantized (OCP MX, compressed-tensors
                   >= 0.20)  ``weight_packed`` uint8 e2m1 pairs (low nibble first) / e2m3
                   codes four per three bytes, a little-endian bitstream (N, K*bits/8), or
                   ``weight`` float8_e4m3fn (N, K); ``weight_scale`` uint8 (N, K/32) biased
                   exponents 2**(s - 127): our e8m0 codes as they are.
Dequantization: ``(q - zp) * scale`` (in the scale dtype, then cast): our float32 values cast
to the producer's dtype are bit-identical.
Signed codes map to our ``intN`` (symmetric) or to ``uintN`` codes ``q + 2**(bits-1)`` with
uint8 zero points ``zp + 2**(bits-1)`` (asymmetric): ``(u - z) == (q - zp)`` exactly.

``input_activations`` map to the spec's activation fields: fp8/int8 per token (dynamic),
per tensor (static, ``input_scale`` becomes ``act_scale``), per group; NVFP4 activations
(tensor_group 16) become ``act="fp4_e2m1"`` with e4m3 group scales and a *dynamic* fp32
global scale: the calibrated ``input_global_scale`` is not used (a warning says so).
"""
from __future__ import annotations

import re

import numpy as np

from humming_jax.checkpoints._common import (Unit, act_order, bias_of, bytes_as_canonical,
                                             expect, float_scale_dtype, make_weight,
                                             codes_from_nk_bytes, spec_or_error,
                                             stream_as_canonical, unpack_stream,
                                             unpack_words, weight_blocks)

import ml_dtypes

_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized",
            "nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp6-pack-quantized",
            "mxfp8-quantized")
# OCP MX formats (compressed-tensors >= 0.20): e8m0 group-32 scales stored as uint8 biased
# exponents; format -> (weight bits, our weight format).  fp4 / fp6 codes are packed as a
# little-endian bitstream along K (two e2m1 per byte, four e2m3 per three bytes), fp8
# stored as float8_e4m3fn.
_MX_FORMATS = {"mxfp4-pack-quantized": (4, "fp4_e2m1"), "mxfp6-pack-quantized": (6, "fp6_e2m3"),
               "mxfp8-quantized": (8, "fp8_e4m3")}
# How compressed-tensors writes MX's scale_dtype in config.json: uint8 biased exponents.
# (With float8_e8m0fnu it converts the exponent's *value* to e8m0 -- 120 becomes 128.0 --
# and its MX scale rule does not run: refused, see _act_fields / the weight scales.)
_E8M0_NAMES = ("torch.uint8", "uint8")
_E8M0_FLOAT_NAMES = ("torch.float8_e8m0fnu", "float8_e8m0fnu")
_KNOWN = {"weight", "weight_packed", "weight_shape", "weight_scale", "weight_zero_point",
          "weight_global_scale", "input_scale", "input_zero_point", "input_global_scale",
          "bias", "weight_g_idx"}
_CLASS_TARGETS = {"Linear", "linear", "Conv1D", "QuantLinear"}


def _matches(target: str, module: str) -> bool:
  if target.startswith("re:"):
    return re.match(target[3:], module) is not None
  return module == target or module.endswith("." + target)


def _scheme_for(module: str, qcfg: dict) -> dict | None:
  """The config group whose targets name this module (explicit names beat class names)."""
  groups = qcfg.get("config_groups") or {}
  explicit, by_class = [], []
  for gname, g in groups.items():
    for t in g.get("targets") or []:
      if t in _CLASS_TARGETS:
        by_class.append((gname, g))
      elif _matches(t, module):
        explicit.append((gname, g))
  found = explicit or by_class
  if len({n for n, _ in found}) > 1:
    raise ValueError(f"module {module!r}: matched by several config_groups "
                     f"{sorted({n for n, _ in found})}")
  return found[0][1] if found else None


def _act_fields(module: str, ia: dict | None, a: dict, notes: list) -> dict:
  if not ia:
    return {}
  bits, typ = int(ia.get("num_bits", 8)), ia.get("type", "int")
  act = {("float", 8): "fp8_e4m3", ("int", 8): "int8", ("float", 4): "fp4_e2m1",
         ("int", 4): "int4"}.get((typ, bits))
  if act is None:
    raise ValueError(f"module {module!r}: input_activations {typ}{bits} has no activation "
                     "format here (int8, int4, fp8 e4m3, fp4 e2m1)")
  if ia.get("symmetric", True) is False:
    raise ValueError(f"module {module!r}: asymmetric input_activations (activation zero "
                     "points) cannot be expressed by QuantSpec")
  strategy, dynamic = ia.get("strategy", "token"), ia.get("dynamic", True)
  f = {"act": act}
  if str(ia.get("scale_dtype")) in _E8M0_FLOAT_NAMES:
    raise ValueError(f"module {module!r}: input_activations scale_dtype "
                     f"{ia.get('scale_dtype')} is not supported (compressed-tensors' MX "
                     "activations store uint8 exponents)")
  mx = str(ia.get("scale_dtype")) in _E8M0_NAMES  # OCP MX activations: e8m0 group scales
  if mx and typ != "float":  # the producer makes MX scales for float elements only
    raise ValueError(f"module {module!r}: input_activations {typ}{bits} with uint8 "
                     f"(e8m0) scales is not an MX format compressed-tensors produces")
  if mx and (strategy != "group" or int(ia.get("group_size") or 0) != 32):
    raise ValueError(f"module {module!r}: input_activations with e8m0 scales "
                     f"({ia.get('scale_dtype')}) need strategy 'group' and group_size 32 (OCP "
                     f"MX); got {strategy!r}, {ia.get('group_size')}")
  if strategy == "token":
    f["act_granularity"] = "token"
  elif strategy == "tensor":
    f["act_granularity"] = "tensor"
    if dynamic is False:
      key = f"{module}.input_scale"
      if key not in a:
        raise ValueError(f"module {module!r}: static input_activations but no tensor {key}")
      s = a[key]
      expect(key, s, s.dtype)
      if s.size != 1:
        raise ValueError(f"tensor {key!r}: shape {s.shape}, expected one value")
      f.update(act_static=True, act_scale=np.float32(s.astype(np.float32).reshape(())))
  elif strategy == "group":
    f.update(act_granularity="group", act_group_size=int(ia["group_size"]))
    if mx:  # compressed-tensors' MX scale rule (after vLLM's reference): amax rounded up
      f.update(act_scale_dtype="e8m0", act_mx_rounding="up")
  elif strategy == "tensor_group":
    f.update(act_granularity="group", act_group_size=int(ia["group_size"]),
             act_scale_dtype="fp8_e4m3")
    if dynamic is not True:
      notes.append(f"{module}: calibrated input_global_scale not used (activation global "
                   "scale is computed per call)")
  else:
    raise ValueError(f"module {module!r}: input_activations strategy {strategy!r} unknown")
  return f


def _dense_packing(name: str, shape: tuple, axis: int, unpacked: tuple, bits: int
                   ) -> bool | None:
  """How ``pack_to_int32`` packed this tensor, read from its shape: True for a dense
  bitstream (compressed-tensors >= 0.18: ceil(count * bits / 32) words, a code may straddle
  two), False for ``32 // bits`` codes per word with the top bits unused (earlier versions),
  None where the shape fits both (1 / 2 / 4 / 8 bits: one layout; short rows at 3 / 5 /
  6 / 7 bits)."""
  count = unpacked[axis]
  dense, per_word = -(-count * bits // 32), -(-count // (32 // bits))
  want = lambda words: tuple(words if i == axis else d for i, d in enumerate(unpacked))
  if tuple(shape) not in (want(dense), want(per_word)):
    forms = " or ".join(sorted({str(want(dense)), str(want(per_word))}))
    raise ValueError(f"tensor {name!r}: shape {tuple(shape)}, expected {forms} ({count} "
                     f"{bits}-bit codes packed along axis {axis})")
  return None if dense == per_word else shape[axis] == dense


def _settle_packing(verdicts: list, name: str, bits: int, qcfg: dict) -> bool:
  """One layout for a layer's packed tensors (:func:`_dense_packing` of each): what their
  shapes say, else the config's compressed-tensors ``version`` (>= 0.18: dense)."""
  said = {v for v in verdicts if v is not None}
  if len(said) > 1:
    raise ValueError(f"tensor {name!r} and its zero points are packed in different layouts")
  if said:
    return said.pop()
  if 32 % bits == 0:
    return True  # one layout
  version = _version(qcfg.get("version"))
  if version is None:
    raise ValueError(f"tensor {name!r}: its {bits}-bit codes fit both compressed-tensors "
                     f"packings (dense, >= 0.18; {32 // bits} per word, earlier) and "
                     f"quantization_config names no version")
  return version >= (0, 18)


def _version(text) -> tuple[int, int] | None:
  """(major, minor) of a compressed-tensors version, or None when unknown -- also for the
  0.17.2 dev / pre-release builds, which may pack either way (the dense packing landed
  after 0.17.1 and setuptools_scm names those builds after the next patch)."""
  match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)", str(text or ""))
  if not match:
    return None
  major, minor = int(match.group(1)), int(match.group(2))
  if (major, minor) == (0, 17) and match.group(3) == "2" and match.group(4):
    return None
  return major, minor


# transform_config locations (compressed-tensors transform_args.py).  Fused into the stored
# weights at export: nothing to do.  q_attn / k_cache (SpinQuant R3): the same rotation of
# queries and keys at run time, which cancels in Q K^T (it helps a quantized KV cache): the
# linear layers are plain.  input / output: the layer's activations rotated at run time,
# which a linear layer of this library does not do -- refused.
OFFLINE_TRANSFORMS = ("weight_input", "weight_output")
CANCELLING_TRANSFORMS = ("q_attn", "k_cache")


def check_transforms(qcfg: dict, where: str = "quantization_config") -> None:
  """Refuse a ``transform_config`` (QuIP / SpinQuant through llm-compressor) that rotates a
  layer's input or output at run time: its stored weights expect rotated activations, so
  ``quant_dense`` on them would be silently wrong (an audit's repro: 1.40 relative error)."""
  where = f"{where}.transform_config"
  tc = qcfg.get("transform_config") or {}
  groups = tc.get("config_groups") if isinstance(tc, dict) else None
  if not isinstance(groups or {}, dict):
    raise ValueError(f"{where}.config_groups: expected a JSON object, got {groups!r}")
  for name, g in sorted((groups or {}).items()):
    applies = g.get("apply") if isinstance(g, dict) else None
    if not isinstance(applies or [], list) or not all(isinstance(a, dict)
                                                     for a in applies or []):
      raise ValueError(f"{where}: group {name!r}: expected an 'apply' list of objects, "
                       f"got {g!r}")
    for a in applies or []:
      loc = a.get("location")
      if loc in OFFLINE_TRANSFORMS + CANCELLING_TRANSFORMS:
        continue
      raise ValueError(
          f"{where}: group {name!r} applies a {g.get('type', '?')!r} transform at location "
          f"{loc!r} (targets {a.get('targets')}) at run time; supported: "
          f"{OFFLINE_TRANSFORMS} (fused into the weights) and {CANCELLING_TRANSFORMS} "
          f"(cancel in Q K^T). Rotations of a layer's input or output are not: the layer "
          f"would need x rotated first")


# Method names of the settings older exports wrote under config.json's compression_config.
_COMPRESSION_CONFIG_METHODS = ("compressed-tensors", "sparseml")


def from_compression_config(cc, where: str) -> dict | None:
  """The quantization settings of an older llm-compressor / SparseML export, which wrote
  them under config.json's ``compression_config`` (compressed-tensors' ``ModelCompressor.
  update_config``): either ``{"quantization_config": {...}, "sparsity_config": {...}}`` or
  the quantization settings themselves with ``sparsity_config`` beside them.  Returns
  compressed-tensors settings (``quant_method`` "compressed-tensors", the sparsity settings
  kept for :func:`check_sparsity`), or None when it holds neither."""
  if not isinstance(cc, dict):
    raise ValueError(f"{where}: compression_config is not a JSON object: {cc!r}")
  sparsity = cc.get("sparsity_config")
  qc = cc.get("quantization_config")
  if qc is None:  # the settings themselves, the sparsity settings beside them
    qc = {k: v for k, v in cc.items() if k != "sparsity_config"}
  if not isinstance(qc, dict):
    raise ValueError(f"{where}: compression_config.quantization_config is not a JSON "
                     f"object: {qc!r}")
  if not qc and sparsity is None:
    return None
  method = str(qc.get("quant_method") or "compressed-tensors").lower()
  if method not in _COMPRESSION_CONFIG_METHODS:
    raise ValueError(f"{where}: compression_config has quant_method {method!r}; expected "
                     f"one of {_COMPRESSION_CONFIG_METHODS}")
  out = {**qc, "quant_method": "compressed-tensors"}
  if sparsity is not None:
    out["sparsity_config"] = sparsity
  return out


# sparsity_config formats whose weights are stored as ordinary dense tensors.
DENSE_SPARSITY = (None, "dense")


def check_sparsity(qcfg: dict, where: str = "quantization_config") -> None:
  """Refuse weights stored sparse-compressed (``sparsity_config.format`` sparse-bitmask,
  sparse-24-bitmask, marlin-24): each such layer holds ``weight.bitmask`` /
  ``weight.compressed`` / ``weight.row_offsets`` (or a 2:4 repack) in place of its weight,
  and would come back as raw leaves of a module named ``...weight``.  Sparsity stored
  dense (``format: dense``: zeros kept in the weight) loads as any other weight."""
  sc = qcfg.get("sparsity_config")
  if sc is None:
    return
  if not isinstance(sc, dict):
    raise ValueError(f"{where}.sparsity_config: expected a JSON object, got {sc!r}")
  if sc.get("format") not in DENSE_SPARSITY:
    raise ValueError(
        f"{where}.sparsity_config: format {sc.get('format')!r} (targets "
        f"{sc.get('targets')}) stores weights sparse-compressed, which this loader does not "
        f"decompress; supported: sparsity stored dense (format 'dense'). Decompress the "
        f"model (compressed-tensors ModelCompressor.decompress) and save it again")


def plan_compressed_tensors(module: str, suffixes: set[str], qcfg: dict,
                            notes: list) -> list[Unit] | None:
  quantized = "weight_packed" in suffixes or ("weight" in suffixes and "weight_scale" in
                                              suffixes)
  if not quantized:
    if suffixes & {"weight_scale", "weight_zero_point", "weight_shape", "weight_global_scale"}:
      raise ValueError(f"module {module!r}: has quantization tensors "
                       f"{sorted(suffixes & _KNOWN - {'bias'})} but no {module}.weight_packed "
                       f"or {module}.weight")
    return None
  if {"qweight", "qzeros", "weight_scale_2"} & suffixes or \
     {"weight", "weight_packed"} <= suffixes:
    raise ValueError(f"module {module!r}: mixed formats in one layer: "
                     f"{sorted(f'{module}.{s}' for s in suffixes)}")
  scheme = _scheme_for(module, qcfg)
  if scheme is None:
    raise ValueError(f"module {module!r}: quantized tensors but no config_groups entry "
                     "targets it")
  fmt = scheme.get("format") or qcfg.get("format")
  if fmt == "mixed-precision" or fmt not in _FORMATS:
    raise ValueError(f"module {module!r}: compressed-tensors format {fmt!r} is not supported "
                     f"(supported: {_FORMATS})")
  wa = scheme.get("weights") or {}
  # actorder "group" (or its aliases "dynamic", true): groups follow weight_g_idx (rows
  # sorted by group on load, _common.act_order); "weight": groups stay contiguous.
  if wa.get("actorder") in ("group", "dynamic", True) and "weight_g_idx" not in suffixes:
    raise ValueError(f"module {module!r}: actorder {wa['actorder']!r} but no tensor "
                     f"{module}.weight_g_idx (the group of each input row)")
  keys = tuple(f"{module}.{s}" for s in sorted(suffixes & _KNOWN))

  def build(a):
    t = lambda s: a.get(f"{module}.{s}")  # noqa: E731
    bits, typ = int(wa.get("num_bits", 8)), wa.get("type", "int")
    strategy = wa.get("strategy")
    sym = wa.get("symmetric", True)
    act = _act_fields(module, scheme.get("input_activations"), a, notes)
    act_scale = act.pop("act_scale", None)
    sname = f"{module}.weight_scale"
    if t("weight_scale") is None:
      raise ValueError(f"module {module!r}: missing tensor {sname}")
    # -- codes (N, K) ------------------------------------------------------------------
    zeros = global_scale = packed = codes = None
    if fmt != "nvfp4-pack-quantized" and t("weight_global_scale") is not None:
      raise ValueError(f"tensor '{module}.weight_global_scale': unexpected for format {fmt!r}")
    if fmt in _MX_FORMATS:
      want = _MX_FORMATS[fmt][0]
      if (typ, bits, strategy, wa.get("group_size")) != ("float", want, "group", 32) \
          or not sym:
        raise ValueError(f"module {module!r}: format {fmt!r} expects symmetric float{want} "
                         f"weights in groups of 32; config_groups says {typ}{bits}, "
                         f"strategy {strategy!r}, group_size {wa.get('group_size')}, "
                         f"symmetric {sym}")
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp6-pack-quantized"):
      cbits, weight = (4, "fp4_e2m1") if fmt == "nvfp4-pack-quantized" else _MX_FORMATS[fmt]
      wname = f"{module}.weight_packed"
      wp = expect(wname, t("weight_packed"), np.uint8)
      if wp.ndim != 2 or (wp.shape[1] * 8) % cbits:
        raise ValueError(f"tensor {wname!r}: shape {wp.shape}, expected (N, K * {cbits} / 8)")
      n, k = wp.shape[0], wp.shape[1] * 8 // cbits
      packed, codes = codes_from_nk_bytes(wp, cbits, k)
      if fmt == "nvfp4-pack-quantized":
        gname = f"{module}.weight_global_scale"
        if t("weight_global_scale") is None:
          raise ValueError(f"module {module!r}: missing tensor {gname}")
        gs = expect(gname, t("weight_global_scale"), np.float32)
        if gs.size != 1:
          raise ValueError(f"tensor {gname!r}: shape {gs.shape}, expected one value")
        global_scale = np.float32(1.0) / gs.reshape(())  # stored as a divisor
    elif fmt in ("float-quantized", "mxfp8-quantized"):
      w = expect(f"{module}.weight", t("weight"), [ml_dtypes.float8_e4m3fn] + (
          [ml_dtypes.float8_e5m2] if fmt == "float-quantized" else []))  # MXFP8: e4m3 only
      n, k = w.shape
      weight = "fp8_e4m3" if w.dtype == ml_dtypes.float8_e4m3fn else "fp8_e5m2"
      packed, codes = codes_from_nk_bytes(w.view(np.uint8), 8, k)
    else:
      if typ != "int":
        raise ValueError(f"module {module!r}: {fmt} with weights type {typ!r}")
      half = 1 << (bits - 1)
      if fmt == "pack-quantized":
        shp = expect(f"{module}.weight_shape", t("weight_shape"), [np.int64, np.int32], (2,))
        n, k = (int(v) for v in shp)
        wname = f"{module}.weight_packed"
        wp = expect(wname, t("weight_packed"), np.int32)
        verdicts = [_dense_packing(wname, wp.shape, 1, (n, k), bits)]
        zp = t("weight_zero_point")
        if not sym and zp is not None and zp.dtype == np.int32 and strategy in ("group",
                                                                                "channel"):
          ng = 1 if strategy == "channel" else -(-k // int(wa["group_size"]))
          verdicts.append(_dense_packing(f"{module}.weight_zero_point", zp.shape, 0,
                                         (n, ng), bits))
        dense = _settle_packing(verdicts, wname, bits, qcfg)
        # a dense bitstream with K % 32 == 0: the (transposed) words are our canonical
        # layout, codes q + half; else the codes are unpacked and packed again
        packed = stream_as_canonical(wp.T, bits, k, flip_sign=sym) if dense else None
        if packed is None:
          unpack = unpack_stream if dense else unpack_words
          q = unpack(wp, bits, k, axis=1).astype(np.int16) - half
      else:
        w = expect(f"{module}.weight", t("weight"), np.int8)
        n, k = w.shape
        q = w.astype(np.int16)
        if bits == 8:  # int8 bytes as they are (sym), or q + 128 = q ^ 0x80 (asym)
          packed = bytes_as_canonical(w.view(np.uint8) ^ np.uint8(0 if sym else 0x80), 8, k)
      weight = f"int{bits}" if sym else f"uint{bits}"
      if packed is None:
        codes = ((q & ((1 << bits) - 1)) if sym else (q + half)).astype(np.uint8)
    # -- scales -> (Gk, Gn) ------------------------------------------------------------
    sc = t("weight_scale")
    if fmt == "nvfp4-pack-quantized":
      expect(sname, sc, ml_dtypes.float8_e4m3fn)
      scale_dtype = "fp8_e4m3"
    elif fmt in _MX_FORMATS:  # uint8 biased exponents, 2**(s - 127): our e8m0 codes
      expect(sname, sc, np.uint8)  # (not F8_E8M0: see _E8M0_NAMES)
      scale_dtype = "e8m0"
    else:
      scale_dtype = float_scale_dtype(sname, sc)
    gran = {}
    if strategy == "tensor":
      if sc.size != 1:
        raise ValueError(f"tensor {sname!r}: shape {sc.shape}, expected one value (tensor)")
      sc, gran = sc.reshape(1, 1), dict(granularity="tensor", group_size=0)
    elif strategy == "channel":
      sc = expect(sname, sc, sc.dtype, (n, 1)).T
      gran = dict(granularity="channel", group_size=0)
    elif strategy in ("group", "tensor_group"):
      g = int(wa["group_size"])
      sc = expect(sname, sc, sc.dtype, (n, -(-k // g))).T
      gran = dict(granularity="group", group_size=g)
    elif strategy == "block":
      bn, bk = (int(v) for v in wa["block_structure"])
      sc = expect(sname, sc, sc.dtype, (-(-n // bn), -(-k // bk))).T
      sc, bn = weight_blocks(f"{module}.weight", sc, k, n, bk, bn)  # partial last blocks
      gran = dict(granularity="block", group_size=bk, block_n=bn)
    else:
      raise ValueError(f"module {module!r}: weights strategy {strategy!r} is not supported")
    if not sym:
      zname = f"{module}.weight_zero_point"
      zp = t("weight_zero_point")
      if zp is None:
        raise ValueError(f"module {module!r}: asymmetric weights but no tensor {zname}")
      ng = sc.shape[0]
      if zp.dtype == np.int32 and fmt == "pack-quantized" and strategy in ("group", "channel"):
        zp = expect(zname, zp, np.int32)  # its shape was checked with weight_packed's
        unpack = unpack_stream if dense else unpack_words
        zeros = unpack(zp, bits, n, axis=0).T  # stored zp + half: our uint8 zeros
      else:
        zp = expect(zname, zp, np.int8, (n, ng))
        zeros = (zp.astype(np.int16) + half).astype(np.uint8).T
    spec = spec_or_error(module, weight=weight, scale_dtype=scale_dtype,
                         zero_point=not sym, global_scale=global_scale is not None,
                         **gran, **act)
    w = make_weight(spec, None if packed is not None else codes.T, np.ascontiguousarray(sc),
                    zeros, global_scale, bias_of(module, a, n), act_scale, packed=packed,
                    shape=(k, n))
    if t("weight_g_idx") is not None:
      w = act_order(module, f"{module}.weight_g_idx", t("weight_g_idx"), w)
    return {"weight": w}

  return [Unit(module, keys, build)]
