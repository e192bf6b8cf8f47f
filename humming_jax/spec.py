"""QuantSpec: the frozen, hashable *description* of a quantization.

A spec says how weights (and optionally activations) are represented; it does not say how
a kernel executes them.  Specs travel as static pytree aux data, so they must be hashable
and cheap to compare.  Every inconsistent combination is refused at construction with a
``ValueError`` that names the offending field.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Literal

import numpy as np

from humming_jax.formats import NumberFormat, get_format

Granularity = Literal["tensor", "channel", "group", "block"]
ActGranularity = Literal["token", "tensor", "group"]

SCALE_DTYPES = ("float32", "bfloat16", "float16", "e8m0", "fp8_e4m3")


@dataclasses.dataclass(frozen=True)
class QuantSpec:
  """Description of a weight (and activation) quantization.

  Weight fields
    weight:        number format of the weight codes (``"int4"``, ``"uint4"``, ``"fp4_e2m1"``,
                   ``"fp8_e4m3"``, ... see :mod:`humming_jax.formats`).
    granularity:   ``"tensor"`` (one scale), ``"channel"`` (one per output column),
                   ``"group"`` (``group_size`` consecutive K rows per output column) or
                   ``"block"`` (2-D ``block_k x block_n`` tiles; DeepSeek style).
    group_size:    rows of K per scale for ``"group"``; ``block_k`` for ``"block"``.
    block_n:       columns per scale for ``"block"``.
    scale_dtype:   storage of the scales: ``float32``, ``bfloat16``, ``float16``, ``e8m0``
                   (power-of-two MX scale) or ``fp8_e4m3`` (NVFP4 block scale).
    zero_point:    asymmetric quantization; requires an unsigned integer weight format.
    global_scale:  a second-level fp32 scale ``s2`` (NVFP4).

  Activation fields (``act=None`` means activations stay in bf16/fp16: WnA16)
    act:              format of the quantized activations (``"int8"``, ``"fp8_e4m3"``,
                      ``"fp4_e2m1"``).
    act_granularity:  ``"token"`` (one scale per row), ``"tensor"`` or ``"group"`` (per row
                      and per ``act_group_size`` columns of K).
    act_group_size:   columns per activation scale for ``"group"``.
    act_scale_dtype:  like ``scale_dtype``.
    act_static:       a calibrated per-tensor scale stored with the params (``act_scale``)
                      instead of a dynamic one computed per call.
    act_mx_rounding:  how a dynamic e8m0 activation scale is taken from its group's amax:
                      ``"floor"`` (OCP MX v1.0: ``2**(floor(log2 amax) - emax)``) or ``"up"``
                      (compressed-tensors and vLLM's MX reference: the amax first rounded to
                      a power of two, upwards from 1.75 times one, so fewer elements clip at
                      the format's largest value).  Checkpoints made so load with ``"up"``.
  """

  weight: str = "int4"
  granularity: Granularity = "group"
  group_size: int = 128
  block_n: int = 0
  scale_dtype: str = "bfloat16"
  zero_point: bool = False
  global_scale: bool = False
  act: str | None = None
  act_granularity: ActGranularity = "token"
  act_group_size: int = 0
  act_scale_dtype: str = "float32"
  act_static: bool = False
  act_mx_rounding: str = "floor"

  def __post_init__(self):
    # Normalise numpy scalars (np.int64 group sizes from a config file, np.bool_ flags)
    # to Python ints and bools, so equal specs compare and hash equal and serialize; a
    # value of another type is refused by name ('no' is not False).
    for field in ("group_size", "block_n", "act_group_size"):
      object.__setattr__(self, field, as_int(field, getattr(self, field), 0))  # None: 0
    for field in ("zero_point", "global_scale", "act_static"):
      object.__setattr__(self, field, _bool_field(field, getattr(self, field)))
    # Normalise format spellings so equal specs hash equal.
    object.__setattr__(self, "weight", _format_field("weight", self.weight).name)
    # group_size means nothing per channel / per tensor: store 0 so that e.g.
    # QuantSpec("int8", "channel") (default group_size 128) equals the "w8a16" preset.
    if self.granularity in ("channel", "tensor"):
      object.__setattr__(self, "group_size", 0)
    if self.act is not None:
      object.__setattr__(self, "act", _format_field("act", self.act).name)
    elif not self.act_static:
      # the activation fields mean nothing without a format: their defaults, so that a
      # spec equals its twin (no recompile) -- as weight_only() and replace(act=None) give
      for field, default in _ACT_DEFAULTS.items():
        object.__setattr__(self, field, default)
    self._validate()

  # ---- derived -------------------------------------------------------------------------
  @property
  def weight_format(self) -> NumberFormat:
    return get_format(self.weight)

  @property
  def act_format(self) -> NumberFormat | None:
    return None if self.act is None else get_format(self.act)

  @property
  def weight_bits(self) -> int:
    return self.weight_format.bits

  @property
  def is_mx(self) -> bool:
    return self.scale_dtype == "e8m0"

  @property
  def name(self) -> str:
    """A short human-readable tag, e.g. ``w4a16-int4-g128``."""
    w = f"w{self.weight_bits}a{self.act_format.bits if self.act else 16}-{self.weight}"
    gran = {"tensor": "-t", "channel": "-ch", "group": f"-g{self.group_size}",
            "block": f"-b{self.group_size}x{self.block_n}"}[self.granularity]
    extra = ("-zp" if self.zero_point else "") + ("-s2" if self.global_scale else "")
    act = ""
    if self.act:
      act = f"-{self.act}-{self.act_granularity}"
      act += f"{self.act_group_size}" if self.act_granularity == "group" else ""
      act += "-static" if self.act_static else ""
      act += "-mxup" if self.act_mx_rounding == "up" else ""
    return f"{w}{gran}-{self.scale_dtype}{extra}{act}"

  def replace(self, **changes) -> "QuantSpec":
    return dataclasses.replace(self, **changes)

  def weight_only(self) -> "QuantSpec":
    """The same weight quantization with activations left unquantized (WnA16)."""
    return self.replace(act=None, act_static=False)  # (the act fields reset with it)

  # ---- presets -------------------------------------------------------------------------
  @staticmethod
  def preset(name: str) -> "QuantSpec":
    """One of :data:`PRESETS` (``"w4a16-g128"``, ``"w8a8-fp8"``, ``"w4a4-nvfp4"``, ...)."""
    if name not in PRESETS:
      raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name]

  # ---- validation ----------------------------------------------------------------------
  def _validate(self) -> None:
    w = self.weight_format
    if w.kind == "e8m0":
      raise ValueError("weight='e8m0' is a scale format, not a weight format")
    if self.granularity not in ("tensor", "channel", "group", "block"):
      raise ValueError(f"granularity={self.granularity!r}; expected 'tensor', 'channel', "
                       "'group' or 'block'")
    if self.granularity in ("group", "block"):
      if not (isinstance(self.group_size, int) and self.group_size > 0):
        raise ValueError(f"group_size={self.group_size!r} must be a positive int for "
                         f"granularity={self.granularity!r}")
      if self.group_size % 16 and self.group_size not in (8,):
        raise ValueError(f"group_size={self.group_size} must be a multiple of 16 (or 8)")
    if self.granularity == "block":
      if not (isinstance(self.block_n, int) and self.block_n > 0):
        raise ValueError(f"block_n={self.block_n!r} must be a positive int for "
                         "granularity='block'")
    elif self.block_n:
      raise ValueError(f"block_n={self.block_n} is only meaningful with granularity='block'")
    if self.scale_dtype not in SCALE_DTYPES:
      raise ValueError(f"scale_dtype={self.scale_dtype!r}; expected one of {SCALE_DTYPES}")
    if self.zero_point and w.kind != "uint":
      raise ValueError(f"zero_point=True needs an unsigned integer weight (uintN); got "
                       f"weight={self.weight!r}")
    if w.kind == "uint" and not self.zero_point:
      raise ValueError(f"weight={self.weight!r} is unsigned: it needs zero_point=True "
                       f"(use 'int{w.bits}' for symmetric quantization)")
    if self.is_mx:
      if self.zero_point:
        raise ValueError("zero_point=True is not allowed with MX (scale_dtype='e8m0') scales")
      if self.granularity != "group":
        raise ValueError(f"scale_dtype='e8m0' needs granularity='group'; got "
                         f"{self.granularity!r}")
    if self.global_scale:
      if self.scale_dtype != "fp8_e4m3":
        raise ValueError("global_scale=True (NVFP4-style two-level scales) needs "
                         f"scale_dtype='fp8_e4m3'; got {self.scale_dtype!r}")
    if self.global_scale and self.zero_point:
      raise ValueError("global_scale=True (two-level fp8 scales) with zero_point=True has no "
                       "quantizer or kernel path; use one or the other")
    if self.scale_dtype == "fp8_e4m3" and not self.global_scale:
      raise ValueError("scale_dtype='fp8_e4m3' needs global_scale=True (the e4m3 block scale "
                       "is relative to an fp32 tensor scale)")
    # Activations.
    if self.act is None:
      if self.act_static:
        raise ValueError("act_static=True needs an activation format (act=...)")
      return
    a = self.act_format
    if a.kind not in ("int", "float") or a.name not in ("int8", "fp8_e4m3", "fp8_e5m2",
                                                        "fp4_e2m1", "int4"):
      raise ValueError(f"act={self.act!r}; activations quantize to 'int8', 'int4', "
                       "'fp8_e4m3', 'fp8_e5m2' or 'fp4_e2m1'")
    if self.act_granularity not in ("token", "tensor", "group"):
      raise ValueError(f"act_granularity={self.act_granularity!r}; expected 'token', "
                       "'tensor' or 'group'")
    if self.act_granularity == "group":
      if not (isinstance(self.act_group_size, int) and self.act_group_size > 0):
        raise ValueError(f"act_group_size={self.act_group_size!r} must be a positive int "
                         "for act_granularity='group'")
    elif self.act_group_size:
      raise ValueError("act_group_size is only meaningful with act_granularity='group'")
    if self.act_scale_dtype not in SCALE_DTYPES:
      raise ValueError(f"act_scale_dtype={self.act_scale_dtype!r}; expected one of "
                       f"{SCALE_DTYPES}")
    if self.act_static and self.act_granularity != "tensor":
      raise ValueError("act_static=True (calibrated scale) needs act_granularity='tensor'")
    if self.act_mx_rounding not in MX_ROUNDINGS:
      raise ValueError(f"act_mx_rounding={self.act_mx_rounding!r}; expected one of "
                       f"{MX_ROUNDINGS}")
    if self.act_mx_rounding != "floor" and (self.act_scale_dtype != "e8m0" or self.act_static):
      raise ValueError(f"act_mx_rounding={self.act_mx_rounding!r} chooses dynamic e8m0 "
                       f"activation scales; this spec has act_scale_dtype="
                       f"{self.act_scale_dtype!r}{', act_static=True' if self.act_static else ''}")
    if a.bits < w.bits:
      raise ValueError(f"act={self.act!r} has {a.bits} bits < weight {self.weight!r} "
                       f"{w.bits} bits: no kernel path computes in fewer activation bits "
                       "than weight bits")
    if a.is_integer and w.is_float:
      raise ValueError(f"act={self.act!r} (integer) with float weight={self.weight!r}: "
                       "integer tensor cores cannot take float weight codes")
    if self.zero_point and a.is_float and a.bits < 8:
      raise ValueError("zero-point weights with fp4 activations have no kernel path")


def as_int(name: str, value, default: int | None = None) -> int | None:
  """An integer option as a Python int -- numpy ints (read from a config) included, bools
  and floats refused by ``name`` -- or ``default`` for None."""
  if value is None:
    return default
  if isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name}={value!r} must be an int")
  try:
    return operator.index(value)
  except TypeError:
    raise ValueError(f"{name}={value!r} must be an int") from None


def _bool_field(field: str, value) -> bool:
  """A flag as a Python bool: bools, numpy bools and the ints 0 / 1; not 'no'."""
  if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer))
                                             and value in (0, 1)):
    return bool(value)
  raise ValueError(f"{field}={value!r} must be True or False")


_ACT_DEFAULTS = {"act_granularity": "token", "act_group_size": 0,
                 "act_scale_dtype": "float32", "act_mx_rounding": "floor"}
MX_ROUNDINGS = ("floor", "up")


def _format_field(field: str, name) -> NumberFormat:
  try:
    return get_format(name)
  except ValueError as e:
    raise ValueError(f"{field}={name!r}: {e}") from None


_P = QuantSpec
PRESETS: dict[str, QuantSpec] = {
    # WnA16
    "w4a16-g128": _P("int4", "group", 128),
    "w4a16-g128-zp": _P("uint4", "group", 128, zero_point=True),
    "w4a16-ch": _P("int4", "channel", 0),
    "w8a16": _P("int8", "channel", 0),
    "w8a16-fp8": _P("fp8_e4m3", "channel", 0, scale_dtype="float32"),
    "w4a16-mxfp4": _P("fp4_e2m1", "group", 32, scale_dtype="e8m0"),
    # MXINT4: int4 codes x e8m0 scale; the e8m0 scale includes the 2**-2 of the spec's 1.2
    # fixed-point element (value = code/4 * 2**floor(log2 amax)), see quantize.py.
    "w4a16-mxint4": _P("int4", "group", 32, scale_dtype="e8m0"),
    "w4a16-nvfp4": _P("fp4_e2m1", "group", 16, scale_dtype="fp8_e4m3", global_scale=True),
    # W8A8
    "w8a8-int8": _P("int8", "channel", 0, scale_dtype="float32", act="int8"),
    "w8a8-fp8": _P("fp8_e4m3", "channel", 0, scale_dtype="float32", act="fp8_e4m3"),
    "w8a8-fp8-block": _P("fp8_e4m3", "block", 128, block_n=128, scale_dtype="float32",
                         act="fp8_e4m3", act_granularity="group", act_group_size=128),
    "w8a8-mxfp8": _P("fp8_e4m3", "group", 32, scale_dtype="e8m0", act="fp8_e4m3",
                     act_granularity="group", act_group_size=32, act_scale_dtype="e8m0"),
    # W4A8
    "w4a8-int8": _P("int4", "group", 128, act="int8"),
    "w4a8-fp8": _P("int4", "group", 128, act="fp8_e4m3"),
    "w4a8-mxfp4": _P("fp4_e2m1", "group", 32, scale_dtype="e8m0", act="fp8_e4m3"),
    # W4A4
    "w4a4-nvfp4": _P("fp4_e2m1", "group", 16, scale_dtype="fp8_e4m3", global_scale=True,
                     act="fp4_e2m1", act_granularity="group", act_group_size=16,
                     act_scale_dtype="fp8_e4m3"),
    "w4a4-mxfp4": _P("fp4_e2m1", "group", 32, scale_dtype="e8m0", act="fp4_e2m1",
                     act_granularity="group", act_group_size=32, act_scale_dtype="e8m0"),
}
del _P
