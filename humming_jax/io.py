"""humming_jax's own checkpoint format: ``save(path, tree)`` / ``load(path)``.

One ``.safetensors`` file.  Every array is a safetensors tensor named ``t<index>``; a dtype
the safetensors numpy API does not take (bfloat16, float8_*, float4_e2m1fn, int4, ...) is
stored as its raw bytes (uint8) and viewed back on load, so every leaf round-trips
bit-exactly.  The header's ``__metadata__["humming_jax"]`` holds a JSON document: the
format version, the tree structure (dicts, lists, tuples, None, Python scalars, arrays,
QuantizedWeight with its spec, logical shape and layout) and each array's dtype and shape.

``load`` opens the file read-only and never writes; a truncated file, a safetensors file
written by something else, or a damaged header raises ``ValueError`` saying which.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from humming_jax.checkpoints._io import SafetensorsFile
from humming_jax.quantize import QuantizedWeight, check_params
from humming_jax.spec import QuantSpec

FORMAT = "humming_jax.checkpoint"
# 2 (session 27): the fp8-MMA layout's (":p8") stored words changed (mgpu_convert.p8_store);
# version 1 files load, except prepared ":p8" weights, which would decode wrongly.
# 3 (session 28): QuantizedWeight's ``fold_base`` leaf (prepared ":cf" layouts, and
# prepared ":sf" layouts: MXFP4 since session 31, NVFP4 since 32); files of versions 1-2
# have none and load with it None (the kernel then computes it per call).
# 4 (session 40): QuantizedWeight's ``input_perm`` leaf (act-order GPTQ layers); older
# files have none and load with it None.
# A tree is written with the lowest version that holds it (no input_perm: 3; no fold_base
# either: 2), which older releases read.
VERSION = 4
READS = (1, 2, 3, VERSION)
_ADDED_LEAVES = ("fold_base", "input_perm")  # QuantizedWeight leaves of versions 3 and 4
_META_KEY = "humming_jax"
# dtypes the safetensors numpy API stores natively; everything else goes as raw bytes.
_NATIVE = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
           "uint16", "uint32", "uint64", "bool"}


def _dtype(name: str) -> np.dtype:
  try:
    return np.dtype(getattr(jnp, name)) if hasattr(jnp, name) else np.dtype(name)
  except TypeError as e:
    raise ValueError(f"checkpoint names an unknown dtype {name!r}") from e


class _Writer:
  def __init__(self):
    self.tensors: dict[str, np.ndarray] = {}
    self.fold_base = False  # whether a QuantizedWeight carries one (version 3)
    self.input_perm = False  # (version 4)

  def add(self, a: Any) -> dict:
    a = np.asarray(jax.device_get(a))
    name = f"t{len(self.tensors)}"
    dt = str(a.dtype)
    if dt in _NATIVE:
      self.tensors[name] = np.ascontiguousarray(a)
    else:  # raw bytes: bit-exact for every ml_dtypes type
      self.tensors[name] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return {"array": name, "dtype": dt, "shape": list(a.shape)}

  def encode(self, node: Any, path: str) -> Any:
    if isinstance(node, QuantizedWeight):
      self.fold_base |= node.fold_base is not None
      self.input_perm |= node.input_perm is not None
      return {"quantized": {
          "spec": dataclasses.asdict(node.spec), "shape": list(node.shape),
          "layout": node.layout,
          # the leaves later versions added are left out when None, so that releases
          # that predate them read the file
          "leaves": {f: (None if getattr(node, f) is None else self.add(getattr(node, f)))
                     for f in QuantizedWeight._LEAVES
                     if f not in _ADDED_LEAVES or getattr(node, f) is not None}}}
    if isinstance(node, Mapping):
      keys = list(node.keys())
      if not all(isinstance(k, str) for k in keys):
        raise TypeError(f"save: dict keys must be str at {path or '<root>'}; got "
                        f"{[type(k).__name__ for k in keys]}")
      return {"dict": {k: self.encode(node[k], f"{path}/{k}") for k in keys}}
    if isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
      kind = "list" if isinstance(node, list) else "tuple"
      return {kind: [self.encode(v, f"{path}/{i}") for i, v in enumerate(node)]}
    if node is None:
      return {"none": None}
    if isinstance(node, (bool, int, float, str)):
      return {"scalar": node}
    if isinstance(node, (jax.Array, np.ndarray, np.generic)):
      return self.add(node)
    raise TypeError(f"save: unsupported leaf of type {type(node).__name__} at "
                    f"{path or '<root>'}; expected dicts, lists, tuples, arrays, "
                    "QuantizedWeight, None or Python scalars")


def save(path: str | os.PathLike, tree: Any) -> None:
  """Write ``tree`` (nested dicts/lists/tuples of arrays and QuantizedWeight) to ``path``.

  The file is written to ``path + ".tmp"`` and renamed, so a crash never leaves a
  half-written checkpoint under ``path``."""
  from safetensors.numpy import save_file
  w = _Writer()
  encoded = w.encode(tree, "")
  version = min(VERSION, 4 if w.input_perm else 3 if w.fold_base else 2)
  doc = {"format": FORMAT, "version": version, "tree": encoded}
  path = os.fspath(path)
  tmp = path + ".tmp"
  try:
    save_file(w.tensors, tmp, metadata={_META_KEY: json.dumps(doc)})
    # safetensors creates its files owner-only (0600); a checkpoint gets the mode any
    # new file gets here (0666 less the umask), as numpy's or torch's would
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):  # (e.g. path is a directory: the rename failed)
      os.remove(tmp)
    raise


def _umask() -> int:
  """The process umask, read without setting it where Linux says it (os.umask sets it:
  a thread creating a file meanwhile would get 0666)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except OSError:
    pass
  mask = os.umask(0o077)  # (elsewhere: set and restore, a restrictive one meanwhile)
  os.umask(mask)
  return mask


def load(path: str | os.PathLike) -> Any:
  """Read a tree written by :func:`save`; arrays come back bit-exact, as jax arrays
  (numpy arrays for 64-bit dtypes when jax's x64 mode is off, since jax would narrow them).

  Raises ValueError for a missing, truncated, foreign or damaged file."""
  from safetensors import safe_open
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f"{path}: no such checkpoint file")
  # One safetensors framing check for the library (checkpoints/_io.py): header length,
  # JSON, every tensor's byte range inside the file.
  meta = SafetensorsFile(path).metadata
  if _META_KEY not in meta:
    raise ValueError(f"{path}: a safetensors file without humming_jax metadata (written by "
                     "another tool?); hj.load reads files written by hj.save")
  try:
    doc = json.loads(meta[_META_KEY])
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: damaged humming_jax metadata ({e})") from None
  if not isinstance(doc, dict) or doc.get("format") != FORMAT:
    raise ValueError(f"{path}: metadata is not a {FORMAT} document")
  if type(doc.get("version")) is not int or doc["version"] not in READS:
    raise ValueError(f"{path}: checkpoint version {doc.get('version')!r}; this humming_jax "
                     f"reads versions {READS}")
  try:
    f = safe_open(path, framework="numpy")
  except Exception as e:  # safetensors raises its own error types
    raise ValueError(f"{path}: cannot read safetensors data ({e})") from None
  with f:
    return _decode_tree(path, doc, f)


def _decode_tree(path: str, doc: dict, f: Any) -> Any:
  names = set(f.keys())

  def array(d: dict) -> jax.Array:
    name = d.get("array")
    if name not in names:
      raise ValueError(f"{path}: metadata names tensor {name!r}, which the file lacks")
    raw = f.get_tensor(name)
    dt, shape = _dtype(d["dtype"]), tuple(d["shape"])
    if d["dtype"] not in _NATIVE:
      if raw.dtype != np.uint8 or raw.size != int(np.prod(shape)) * dt.itemsize:
        raise ValueError(f"{path}: tensor {name} holds {raw.size} bytes; metadata says "
                         f"{d['dtype']}{list(shape)}")
      raw = raw.view(dt)
    if str(raw.dtype) != d["dtype"] or raw.size != int(np.prod(shape)):
      raise ValueError(f"{path}: tensor {name} is {raw.dtype}{list(raw.shape)}; metadata "
                       f"says {d['dtype']}{list(shape)}")
    raw = raw.reshape(shape)
    # 64-bit dtypes stay numpy unless jax_enable_x64: jax would narrow them silently.
    return jnp.asarray(raw) if jax.dtypes.canonicalize_dtype(raw.dtype) == raw.dtype else raw

  def decode(node: Any, where: str = "") -> Any:
    if not isinstance(node, dict) or len(node) not in (1, 3):
      raise ValueError(f"{path}: damaged tree entry {str(node)[:80]}")
    if "array" in node:
      return array(node)
    (kind, val), = node.items()
    if kind == "dict":
      return {k: decode(v, f"{where}/{k}") for k, v in val.items()}
    if kind == "list":
      return [decode(v, f"{where}/{i}") for i, v in enumerate(val)]
    if kind == "tuple":
      return tuple(decode(v, f"{where}/{i}") for i, v in enumerate(val))
    if kind == "none":
      return None
    if kind == "scalar":
      return val
    if kind == "quantized":
      if doc["version"] == 1 and "p8" in str(val["layout"]).split(":")[1:]:
        raise ValueError(f"{path}: prepared weights of layout {val['layout']!r} written by "
                         f"checkpoint version 1, whose fp8-MMA (':p8') words this "
                         f"humming_jax stores differently; prepare them again from the "
                         f"canonical (or original) checkpoint")
      names = set(val["leaves"])
      if not names <= set(QuantizedWeight._LEAVES) or not {"codes", "scales"} <= names:
        raise ValueError(f"{path}: quantized weight {where or '/'} stores leaves "
                         f"{sorted(names)}; expected codes, scales and some of "
                         f"{list(QuantizedWeight._LEAVES[2:])}")
      leaves = {k: (None if v is None else array(v)) for k, v in val["leaves"].items()}
      try:
        spec = QuantSpec(**val["spec"])
      except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: invalid spec in checkpoint ({e})") from None
      q = QuantizedWeight(**leaves, spec=spec, shape=tuple(val["shape"]),
                          layout=val["layout"])
      check_params(q, f"{path}: quantized weight {where or '/'}")
      return q
    raise ValueError(f"{path}: unknown tree entry kind {kind!r}")

  try:
    return decode(doc["tree"])
  except KeyError as e:
    raise ValueError(f"{path}: damaged humming_jax metadata (missing {e})") from None
  except (TypeError, AttributeError) as e:  # an entry of the wrong JSON type
    raise ValueError(f"{path}: damaged humming_jax metadata ({type(e).__name__}: "
                     f"{e})") from None
  except ValueError as e:
    if str(e).startswith(path):
      raise
    raise ValueError(f"{path}: damaged humming_jax metadata ({e})") from None


__all__ = ["save", "load"]
