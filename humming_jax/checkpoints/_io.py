"""Read-only, streaming access to a HF-style checkpoint directory.

safetensors files are parsed here directly (8-byte header length, JSON header, raw data) and
mapped with a read-only ``np.memmap``: ``safetensors.safe_open(framework="numpy")`` cannot
return bfloat16 or float8 tensors (numpy has no such dtypes), while ml_dtypes gives us all of
them.  Nothing here ever opens a file for writing.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Iterator

import ml_dtypes
import numpy as np

# safetensors dtype tags -> numpy / ml_dtypes dtypes.
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu,
}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsFile:
  """One .safetensors file: its header, and tensors read on demand (read-only memmap)."""

  def __init__(self, path: str):
    self.path = path
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      raw = f.read(8)
      if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header "
                         "length)")
      (n,) = struct.unpack("<Q", raw)
      if n <= 0 or n > _MAX_HEADER or 8 + n > size:
        raise ValueError(f"{path}: not a safetensors file or truncated (header length {n}, "
                         f"file size {size})")
      try:
        header = json.loads(f.read(n))
      except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a safetensors file (header is not JSON: {e})") from None
    if not isinstance(header, dict):
      raise ValueError(f"{path}: not a safetensors file (header is not a JSON object)")
    self.metadata = header.pop("__metadata__", None) or {}
    self.data_start = 8 + n
    self.entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
    for key, e in header.items():
      try:
        tag, shape, (lo, hi) = e["dtype"], tuple(int(s) for s in e["shape"]), e["data_offsets"]
      except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: malformed header entry for tensor {key!r}: {e!r}") from None
      if tag not in DTYPES:
        raise ValueError(f"{path}: tensor {key!r} has dtype {tag!r}; supported dtypes are "
                         f"{sorted(DTYPES)}")
      dt = np.dtype(DTYPES[tag])
      if hi - lo != int(np.prod(shape)) * dt.itemsize or lo < 0:
        raise ValueError(f"{path}: tensor {key!r} byte range {lo}..{hi} does not match its "
                         f"shape {shape} x {dt}")
      if self.data_start + hi > size:
        raise ValueError(f"{path}: truncated: tensor {key!r} ends at byte "
                         f"{self.data_start + hi} but the file has {size} bytes")
      self.entries[key] = (dt, shape, lo, hi)
    self._mm = None

  def keys(self) -> list[str]:
    return list(self.entries)

  def get(self, key: str) -> np.ndarray:
    """A private in-memory copy of tensor ``key``."""
    if key not in self.entries:
      raise ValueError(f"{self.path}: tensor {key!r} is not in this file")
    dt, shape, lo, hi = self.entries[key]
    if self._mm is None:
      self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
    raw = np.array(self._mm[self.data_start + lo:self.data_start + hi])
    return raw.view(dt).reshape(shape)

  def close(self) -> None:
    self._mm = None


class CheckpointDir:
  """config.json + model.safetensors or a sharded ``model.safetensors.index.json``."""

  def __init__(self, path: str):
    path = os.fspath(path)
    if not os.path.isdir(path):
      raise ValueError(f"path={path!r}: expected a checkpoint directory (config.json + "
                       "model.safetensors or model.safetensors.index.json)")
    self.path = path
    self.config = self._json("config.json", required=False) or {}
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
      idx = self._json("model.safetensors.index.json", required=True)
      wm = idx.get("weight_map") if isinstance(idx, dict) else None
      if not isinstance(wm, dict) or not wm:
        raise ValueError(f"{index}: no 'weight_map' object mapping tensor names to shards")
      self.weight_map = {str(k): str(v) for k, v in wm.items()}
      self.shards = sorted(set(self.weight_map.values()))
      for s in self.shards:
        if os.path.basename(s) != s or not os.path.exists(os.path.join(path, s)):
          raise ValueError(f"{index}: shard {s!r} (listed in weight_map) is missing")
    elif os.path.exists(single):
      self.shards = ["model.safetensors"]
      self.weight_map = {k: "model.safetensors" for k in SafetensorsFile(single).keys()}
    else:
      raise ValueError(f"path={path!r}: no model.safetensors or "
                       "model.safetensors.index.json in the directory")

  def _json(self, name: str, required: bool):
    p = os.path.join(self.path, name)
    if not os.path.exists(p):
      if required:
        raise ValueError(f"{p}: missing")
      return None
    with open(p, "rb") as f:
      try:
        return json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None

  def extra_json(self, name: str):
    """Another JSON file of the directory (e.g. ModelOpt's hf_quant_config.json) or None."""
    return self._json(name, required=False)

  def iter_shards(self) -> Iterator[tuple[str, SafetensorsFile]]:
    """Shard by shard; each shard's header is checked against the index."""
    for s in self.shards:
      f = SafetensorsFile(os.path.join(self.path, s))
      have = set(f.keys())
      for k, v in self.weight_map.items():
        if v == s and k not in have:
          raise ValueError(f"tensor {k!r}: the index puts it in {s}, which does not hold it")
      yield s, f
      f.close()
