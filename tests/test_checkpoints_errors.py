"""load_checkpoint refuses broken or foreign input with errors that name the tensor, and never
writes to the source directory."""
import hashlib
import json
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import humming_jax as hj
from humming_jax.checkpoints import load_checkpoint
from humming_jax.checkpoints._io import SafetensorsFile

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "checkpoints")
MOD = "model.layers.0.mlp.down_proj"  # (K=64, N=128) in gptq-w8-ch-sym (one shard, fp16)


def _tensors(name="gptq-w8-ch-sym"):
  f = SafetensorsFile(os.path.join(FIX, name, "model.safetensors"))
  return {k: f.get(k) for k in f.keys()}


def _make(tmp_path, tensors, config=None, name="gptq-w8-ch-sym"):
  d = tmp_path / "ckpt"
  d.mkdir()
  cfg = json.load(open(os.path.join(FIX, name, "config.json")))
  if config is not None:
    cfg["quantization_config"].update(config)
  (d / "config.json").write_text(json.dumps(cfg))
  save_file(tensors, str(d / "model.safetensors"))
  return str(d)


def _load(path, **kw):
  return load_checkpoint(path, progress=False, **kw)


def test_roundtrip_of_the_test_helper(tmp_path):
  """The rewritten fixture loads (so the failures below come from the edits)."""
  tree = _load(_make(tmp_path, _tensors()))
  assert isinstance(tree["model"]["layers"]["0"]["mlp"]["down_proj"]["weight"],
                    hj.QuantizedWeight)


def test_missing_tensor(tmp_path):
  t = _tensors()
  del t[f"{MOD}.scales"]
  with pytest.raises(ValueError, match=rf"missing tensor {MOD}\.scales"):
    _load(_make(tmp_path, t))


def test_wrong_shape(tmp_path):
  t = _tensors()
  t[f"{MOD}.scales"] = np.concatenate([t[f"{MOD}.scales"]] * 2, 0)
  with pytest.raises(ValueError, match=rf"tensor '{MOD}\.scales': shape \(2, 128\), "
                                       r"expected \(1, 128\)"):
    _load(_make(tmp_path, t))


def test_wrong_dtype(tmp_path):
  t = _tensors()
  t[f"{MOD}.qweight"] = t[f"{MOD}.qweight"].astype(np.float32)
  with pytest.raises(ValueError, match=rf"tensor '{MOD}\.qweight': dtype float32"):
    _load(_make(tmp_path, t))


def test_mixed_formats_in_one_layer(tmp_path):
  t = _tensors()
  rng = np.random.default_rng(0)
  t[f"{MOD}.weight_packed"] = rng.integers(0, 2**31, (128, 8), dtype=np.int32)
  with pytest.raises(ValueError, match=rf"module '{MOD}': mixed formats in one layer"):
    _load(_make(tmp_path, t))


def test_act_order_groups_of_unequal_size_are_refused(tmp_path):
  """Act-order g_idx loads (tests/test_checkpoints.py); one whose groups do not each hold
  group_size rows has no contiguous layout and is refused by name."""
  t = _tensors("gptq-w3-g32-asym")
  g = t[f"{MOD}.g_idx"].copy()
  g[0] = g[-1]  # group 0 one row short, the last group one row over
  t[f"{MOD}.g_idx"] = np.random.default_rng(1).permutation(g).astype(np.int32)
  with pytest.raises(ValueError, match=rf"tensor '{MOD}\.g_idx': act-order groups must each "
                                       "hold group_size=32 rows"):
    _load(_make(tmp_path, t, name="gptq-w3-g32-asym"))


def test_unknown_format(tmp_path):
  d = _make(tmp_path, _tensors(), {"quant_method": "bitsandbytes"})
  with pytest.raises(ValueError, match=r"ckpt/config.json: unknown quant_method "
                                       r"'bitsandbytes'"):
    _load(d)
  with pytest.raises(ValueError, match=r"format='exl2'; expected one of"):
    _load(d, format="exl2")


def test_format_override(tmp_path):
  """format='float' reads every tensor as stored, quantized ones included."""
  tree = _load(os.path.join(FIX, "gptq-w8-ch-sym"), format="float")
  qw = tree["model"]["layers"]["0"]["mlp"]["down_proj"]["qweight"]
  assert qw.dtype == np.int32 and qw.shape == (16, 128)


def test_truncated_file(tmp_path):
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, "ct-w4a16-g32-sym"), d)
  raw = (d / "model.safetensors").read_bytes()
  (d / "model.safetensors").write_bytes(raw[:-100])
  with pytest.raises(ValueError, match=r"truncated: tensor '[a-z_.0-9]+' ends at byte"):
    _load(str(d))


def test_foreign_file(tmp_path):
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, "ct-w4a16-g32-sym"), d)
  (d / "model.safetensors").write_bytes(np.random.default_rng(2).bytes(4096))
  with pytest.raises(ValueError, match="not a safetensors file"):
    _load(str(d))


def test_missing_shard_and_index_lies(tmp_path):
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, "gptq-w4-g32-sym"), d)
  os.remove(d / "model-00002-of-00002.safetensors")
  with pytest.raises(ValueError, match="shard 'model-00002-of-00002.safetensors'.*missing"):
    _load(str(d))
  shutil.copy(os.path.join(FIX, "gptq-w4-g32-sym", "model-00001-of-00002.safetensors"),
              d / "model-00002-of-00002.safetensors")
  with pytest.raises(ValueError, match=r"tensor 'model\.[a-z_.0-9]+': the index puts it in "
                                       r"model-00002-of-00002"):
    _load(str(d))


def test_not_a_directory(tmp_path):
  with pytest.raises(ValueError, match="expected a checkpoint directory"):
    _load(str(tmp_path / "nope"))


def test_ct_asymmetric_without_zero_point(tmp_path):
  name = "ct-w4a16-g32-asym"
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, name), d)
  idx = SafetensorsFile(str(d / "model.safetensors"))
  keep = [k for k in idx.keys() if not k.endswith("down_proj.weight_zero_point")]
  # rewrite without the zero point via a raw header edit (bf16 tensors: no numpy writer)
  raw = (d / "model.safetensors").read_bytes()
  n = int.from_bytes(raw[:8], "little")
  header = json.loads(raw[8:8 + n])
  header.pop("model.layers.0.mlp.down_proj.weight_zero_point")
  hb = json.dumps(header).encode()
  (d / "model.safetensors").write_bytes(len(hb).to_bytes(8, "little") + hb + raw[8 + n:])
  assert len(keep) == len(idx.keys()) - 1
  with pytest.raises(ValueError, match=r"asymmetric weights but no tensor "
                                       r"model\.layers\.0\.mlp\.down_proj\.weight_zero_point"):
    _load(str(d))


@pytest.mark.parametrize("name", ["gptq-w4-g32-sym", "ct-nvfp4", "gptoss-mxfp4"])
def test_source_is_never_written(name):
  d = os.path.join(FIX, name)

  def snapshot():
    out = {}
    for fn in sorted(os.listdir(d)):
      p = os.path.join(d, fn)
      out[fn] = (os.stat(p).st_mtime_ns, hashlib.sha256(open(p, "rb").read()).hexdigest())
    return out

  before = snapshot()
  _load(d)
  assert snapshot() == before


def _write(tmp_path, qc, tensors):
  d = tmp_path / "ckpt"
  d.mkdir(parents=True)
  (d / "config.json").write_text(json.dumps({"quantization_config": qc}))
  save_file(tensors, str(d / "model.safetensors"))
  return str(d)


def test_a_group_that_does_not_divide_k_is_refused_at_load(tmp_path):
  """AutoGPTQ makes the last group short when the group size does not divide K (Falcon-7B:
  K 4544, groups of 128); the canonical layout has equal groups.  That layer loaded and
  failed at its first use with a message about 'q'; now the load refuses it, naming the
  file and the layer (session 48's loader audit)."""
  k, n, g = 96, 32, 64
  rng = np.random.default_rng(0)
  codes = rng.integers(0, 256, (k, n)).astype(np.uint32)
  zeros = np.full((2, n), 128, np.uint32) - 1  # v1: stored minus one
  pack = lambda a: sum(a[j::4] << np.uint32(8 * j) for j in range(4))  # 4 codes per word
  tensors = {"m.proj.qweight": pack(codes).view(np.int32),
             "m.proj.qzeros": pack(zeros.T).T.copy().view(np.int32),
             "m.proj.scales": rng.uniform(0.01, 0.05, (2, n)).astype(np.float16),
             "m.proj.g_idx": (np.arange(k) // g).astype(np.int32)}
  qc = {"quant_method": "gptq", "bits": 8, "group_size": g, "sym": True, "desc_act": False}
  with pytest.raises(ValueError, match=r"ckpt: m\.proj\.weight: shape \(K=96, N=32\): the "
                                       r"scale blocks \(64 x 1"):
    _load(_write(tmp_path, qc, tensors))
  # the same layer with K a multiple of the group loads
  tensors["m.proj.qweight"] = pack(codes[:64]).view(np.int32)
  tensors["m.proj.scales"] = tensors["m.proj.scales"][:1]
  tensors["m.proj.qzeros"] = tensors["m.proj.qzeros"][:1]
  tensors["m.proj.g_idx"] = tensors["m.proj.g_idx"][:64]
  assert _load(_write(tmp_path / "ok", qc, tensors))["m"]["proj"]["weight"].shape == (64, n)


@pytest.mark.parametrize("location,refused", [("input", True), ("output", True),
                                              ("weight_input", False), ("k_cache", False)])
def test_ct_online_transforms_are_refused(tmp_path, location, refused):
  """compressed-tensors' transform_config (QuIP / SpinQuant): a rotation fused into the
  weights ('weight_input') loads, and so does SpinQuant's R3 on queries and keys
  ('q_attn' / 'k_cache': it cancels in Q K^T); one applied to a layer's activations at
  run time ('input' / 'output') would make every output wrong: refused, naming it."""
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, "ct-w8a16-ch-sym"), d)
  cfg = json.loads((d / "config.json").read_text())
  cfg["quantization_config"]["transform_config"] = {"config_groups": {"v": {
      "type": "hadamard", "apply": [
          {"targets": ["Linear"], "location": "weight_input", "inverse": True},
          {"targets": ["Linear"], "location": location, "inverse": False}]}}}
  (d / "config.json").write_text(json.dumps(cfg))
  if refused:
    with pytest.raises(ValueError, match=r"transform_config: group 'v' applies a 'hadamard' "
                                         rf"transform at location '{location}'"):
      _load(str(d))
  else:
    assert _load(str(d))
  cfg["quantization_config"]["transform_config"] = {"config_groups": {"v": {"apply": ["x"]}}}
  (d / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"group 'v': expected an 'apply' list of objects"):
    _load(str(d))


def _save_raw(tensors: dict, path: str) -> None:
  """A safetensors file of ml_dtypes arrays (bf16 / fp8; uint8 / float32 beside them),
  which safetensors.numpy cannot write: the header, then each tensor's bytes."""
  names = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float32": "F32", "uint8": "U8",
           "float8_e8m0fnu": "F8_E8M0", "float8_e5m2": "F8_E5M2"}
  header, off, blobs = {}, 0, []
  for k, a in tensors.items():
    b = np.ascontiguousarray(a).tobytes()
    header[k] = {"dtype": names[a.dtype.name], "shape": list(a.shape),
                 "data_offsets": [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
  hb = json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(len(hb).to_bytes(8, "little") + hb + b"".join(blobs))


def test_ct_fp8_blocks_over_a_partial_last_block(tmp_path):
  """compressed-tensors block FP8 over an N that is not a multiple of the block (exporters
  pad the last block: DeepSeek's kv_a_proj_with_mqa, N 576 with 128-wide blocks): column
  blocks of gcd(bn, N), each scale repeated -- the same weight, exactly (it failed at first
  use before, session 48's loader audit).  A K that is not a multiple of the block is
  refused at load, naming the tensor."""
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, "ct-fp8-block"), d)
  f = SafetensorsFile(str(d / "model.safetensors"))
  t = {k: f.get(k) for k in f.keys()}
  mod = "model.layers.0.mlp.down_proj"  # torch (N, K) = (128, 64), 64 x 64 blocks
  w8 = t[f"{mod}.weight"][:96]  # N = 96: the second 64-row block is partial
  t[f"{mod}.weight"] = w8
  os.remove(d / "model.safetensors")
  _save_raw(t, str(d / "model.safetensors"))
  q = _load(str(d))["model"]["layers"]["0"]["mlp"]["down_proj"]["weight"]
  assert q.shape == (64, 96) and q.spec.block_n == 32
  s = t[f"{mod}.weight_scale"].astype(np.float32)  # (2, 1): one per 64 x 64 block
  want = w8.astype(np.float32) * np.repeat(s, 64, axis=0)[:96]
  np.testing.assert_array_equal(np.asarray(hj.dequantize(q), np.float32), want.T)
  t[f"{mod}.weight"] = t[f"{mod}.weight"][:, :48]  # K = 48: not a multiple of 64
  _save_raw(t, str(d / "model.safetensors"))
  with pytest.raises(ValueError, match=rf"tensor '{mod}\.weight': K=48 is not a multiple"):
    _load(str(d))


def _leaves_equal(a, b):
  import jax
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                    for x, y in zip(la, lb))


@pytest.mark.parametrize("name,file,settings", [
    ("gptq-w4-g32-sym", "quantize_config.json",  # AutoGPTQ's own file
     {"bits": 4, "group_size": 32, "desc_act": False, "sym": True}),
    ("awq-w4-g32", "quant_config.json",  # AutoAWQ's, its own field names
     {"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"})])
def test_settings_beside_config_json(tmp_path, name, file, settings):
  """Older AutoGPTQ / AutoAWQ exports keep their settings in quantize_config.json /
  quant_config.json, not in config.json: they were read as a float checkpoint (raw int32
  qweight leaves, no warning; session 48's loader audit).  Now they load as the same
  params as with the settings in config.json."""
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, name), d)
  cfg = json.loads((d / "config.json").read_text())
  del cfg["quantization_config"]
  (d / "config.json").write_text(json.dumps(cfg))
  (d / file).write_text(json.dumps(settings))
  assert _leaves_equal(_load(str(d)), _load(os.path.join(FIX, name)))
  # config.json's settings win over the side file; a side file's bad settings name it
  (d / file).write_text(json.dumps({**settings, "quant_method": "quanto"}))
  with pytest.raises(ValueError, match=rf"ckpt/{file}: unknown quant_method 'quanto'"):
    _load(str(d))
  (d / "config.json").write_text(json.dumps(
      {**cfg, "quantization_config": json.load(open(os.path.join(FIX, name, "config.json")))[
          "quantization_config"]}))
  assert _leaves_equal(_load(str(d)), _load(os.path.join(FIX, name)))
  (d / "config.json").write_text(json.dumps(cfg))
  # no settings anywhere: refused by name, unless float is asked for
  os.remove(d / file)
  with pytest.raises(ValueError, match=r"holds quantized tensors \['qweight', 'qzeros'"):
    _load(str(d))
  raw = _load(str(d), format="float")
  assert raw["model"]["layers"]["0"]["mlp"]["down_proj"]["qweight"].dtype == np.int32


def test_gptq_marlin_repack_is_refused(tmp_path):
  """AutoGPTQ's is_marlin_format exports hold B / s tensors, not qweight: they loaded as
  float leaves without a word."""
  d = _make(tmp_path, _tensors(), {"is_marlin_format": True})
  with pytest.raises(ValueError, match=r"is_marlin_format=true .* is not supported"):
    _load(d)


@pytest.mark.parametrize("form", ["flat", "nested", "sparseml"])
def test_ct_settings_under_compression_config(tmp_path, form):
  """Older llm-compressor / SparseML exports wrote their settings under config.json's
  ``compression_config`` (the settings themselves, or {"quantization_config": ...,
  "sparsity_config": ...}), not ``quantization_config``: they were refused as a float
  checkpoint holding quantized tensors.  Now they load as the same params."""
  name = "ct-w8a16-ch-sym"
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, name), d)
  cfg = json.loads((d / "config.json").read_text())
  qc = cfg.pop("quantization_config")
  if form == "nested":
    cc = {"quantization_config": qc, "sparsity_config": {"format": "dense"}}
  else:
    cc = {**qc, "sparsity_config": {"format": "dense"}}
    if form == "sparseml":
      cc["quant_method"] = "sparseml"
  (d / "config.json").write_text(json.dumps({**cfg, "compression_config": cc}))
  assert _leaves_equal(_load(str(d)), _load(os.path.join(FIX, name)))
  assert hj.checkpoints.detect_format(str(d)) == "compressed-tensors"
  # weights stored sparse-compressed are refused by the format, not loaded as raw leaves
  (d / "config.json").write_text(json.dumps({**cfg, "compression_config": {
      **cc, "sparsity_config": {"format": "sparse-bitmask", "targets": ["Linear"]}}}))
  with pytest.raises(ValueError, match=r"ckpt/config.json \(compression_config\)\.sparsity_"
                                       r"config: format 'sparse-bitmask' \(targets "
                                       r"\['Linear'\]\) stores weights sparse-compressed"):
    _load(str(d))
  (d / "config.json").write_text(json.dumps({**cfg, "compression_config": [qc]}))
  with pytest.raises(ValueError, match=r"ckpt/config.json: compression_config is not a JSON"):
    _load(str(d))
  (d / "config.json").write_text(json.dumps({**cfg, "compression_config": {
      **qc, "quant_method": "gptq"}}))
  with pytest.raises(ValueError, match=r"compression_config has quant_method 'gptq'"):
    _load(str(d))


def test_ct_sparse_compressed_weights_are_refused(tmp_path):
  """The current form: sparsity_config inside quantization_config (HF's
  CompressedTensorsConfig).  A 2:4 bitmask export is refused by name; 'dense' loads."""
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, "ct-w8a16-ch-sym"), d)
  cfg = json.loads((d / "config.json").read_text())
  cfg["quantization_config"]["sparsity_config"] = {"format": "sparse-24-bitmask",
                                                   "targets": ["Linear"]}
  (d / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"format 'sparse-24-bitmask'"):
    _load(str(d))
  cfg["quantization_config"]["sparsity_config"] = {"format": "dense"}
  (d / "config.json").write_text(json.dumps(cfg))
  assert _leaves_equal(_load(str(d)), _load(os.path.join(FIX, "ct-w8a16-ch-sym")))
  # an older compression_config beside it still speaks for the sparsity
  del cfg["quantization_config"]["sparsity_config"]
  cfg["compression_config"] = {"sparsity_config": {"format": "sparse-bitmask"}}
  (d / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"format 'sparse-bitmask'"):
    _load(str(d))


_MX_MOD = "model.layers.0.mlp.down_proj"


def _mx_edit_tensor(leaf, fn):
  """An edit of one of _MX_MOD's tensors."""
  return lambda t: t.update({f"{_MX_MOD}.{leaf}": fn(t[f"{_MX_MOD}.{leaf}"])})


@pytest.mark.parametrize("name,edit_cfg,edit_t,match", [
    ("ct-mxfp4", lambda g: g["weights"].update(group_size=16), None,
     r"format 'mxfp4-pack-quantized' expects symmetric float4 weights in groups of 32; "
     r"config_groups says float4, strategy 'group', group_size 16"),
    ("ct-mxfp8", None, _mx_edit_tensor("weight_scale", lambda a: a.astype(np.float32)),
     rf"tensor '{_MX_MOD}\.weight_scale': dtype float32"),
    ("ct-mxfp6", None, _mx_edit_tensor("weight_packed", lambda a: a[:, :47].copy()),
     rf"tensor '{_MX_MOD}\.weight_packed': shape \(128, 47\), expected \(N, K \* 6 / 8\)"),
    ("ct-mxfp4-a4", lambda g: g["input_activations"].update(group_size=16), None,
     r"input_activations with e8m0 scales \(torch.uint8\) need strategy 'group' and "
     r"group_size 32"),
    # e8m0-typed scales: compressed-tensors converts the exponent's value, not its bits
    ("ct-mxfp4", None, _mx_edit_tensor("weight_scale",
                                       lambda a: a.view(ml_dtypes.float8_e8m0fnu)),
     rf"tensor '{_MX_MOD}\.weight_scale': dtype float8_e8m0fnu"),
    ("ct-mxfp4-a4", lambda g: g["input_activations"].update(
        scale_dtype="torch.float8_e8m0fnu"), None,
     r"input_activations scale_dtype torch.float8_e8m0fnu is not supported"),
    # uint8 scales on integer activations: no MX format the producer makes
    ("ct-mxfp4-a4", lambda g: g["input_activations"].update(type="int", num_bits=8), None,
     r"input_activations int8 with uint8 \(e8m0\) scales is not an MX format"),
    # MXFP8 weights are e4m3 (the producer writes nothing else)
    ("ct-mxfp8", None, _mx_edit_tensor("weight", lambda a: a.astype(np.float32).astype(
        ml_dtypes.float8_e5m2)), rf"tensor '{_MX_MOD}\.weight': dtype float8_e5m2"),
])
def test_ct_mx_formats_refuse_what_they_cannot_mean(tmp_path, name, edit_cfg, edit_t, match):
  """compressed-tensors MX exports (mxfp4 / mxfp6 / mxfp8, e8m0 uint8 scales in groups of
  32): a config that does not say float weights in groups of 32, a scale tensor that is not
  uint8 exponents, a 6-bit byte row that is not whole codes, MX activations not in groups
  of 32 or with e8m0-typed scales, and e5m2 MXFP8 weights are refused, naming the module
  or tensor.  The untouched copy loads."""
  d = tmp_path / "ckpt"
  shutil.copytree(os.path.join(FIX, name), d)
  assert _load(str(d))
  if edit_cfg:
    cfg = json.loads((d / "config.json").read_text())
    edit_cfg(cfg["quantization_config"]["config_groups"]["group_0"])
    (d / "config.json").write_text(json.dumps(cfg))
  if edit_t:
    f = SafetensorsFile(str(d / "model.safetensors"))
    t = {k: f.get(k) for k in f.keys()}
    edit_t(t)
    os.remove(d / "model.safetensors")
    _save_raw(t, str(d / "model.safetensors"))
  with pytest.raises(ValueError, match=match):
    _load(str(d))

