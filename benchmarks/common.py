"""Timing helpers shared by the benchmarks: the chain method of shared/GPU.md.

One 8192x8192 int4 layer (32 MB) fits in the H200's 60 MB L2, so timing one layer in a loop
measures the cache.  Instead: a chain of L >= 8 layers with distinct weights in one jitted
call, many calls back to back, block at the end, divide by calls x L.  Warm up first,
report the median of several repeats, compile time separately.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def prepass_variant_env(variant: str) -> dict[str, str] | None:
  """``s<S>[w<W>]``: the decode pre-pass split over S programs per row, W warps each
  (act_prepass.decode_splits / decode_warps), as the environment those switches read at
  trace time (no w<W>: "", the default warps); None for any other string."""
  from humming_jax.kernels import act_prepass  # noqa: PLC0415
  hit = re.fullmatch(r"s(\d+)(?:w(\d+))?", variant)
  if not hit:
    return None
  return {act_prepass.SPLITS_ENV: hit[1], act_prepass.WARPS_ENV: hit[2] or ""}


def spec_arg(name: str):
  """A benchmark's spec argument: a preset name (``w4a16-g128``), else
  ``<weight>:<granularity>[:zp][:<scale_dtype>]`` with granularity ``g<size>``, ``ch``
  or ``t`` (``int3:g128``, ``uint3:g128:zp``, ``fp8_e5m2:ch``) for the formats no preset
  names."""
  from humming_jax.spec import PRESETS, SCALE_DTYPES, QuantSpec  # noqa: PLC0415
  if name in PRESETS:
    return PRESETS[name]
  weight, _, rest = name.partition(":")
  parts = rest.split(":") if rest else []
  if not parts:
    raise ValueError(f"spec {name!r}: expected a preset ({sorted(PRESETS)}) or "
                     f"<weight>:<g<size>|ch|t>[:zp][:<scale_dtype>]")
  gran, kw = parts[0], {}
  if gran.startswith("g") and gran[1:].isdecimal():
    kw.update(granularity="group", group_size=int(gran[1:]))
  elif gran in ("ch", "t"):
    kw.update(granularity="channel" if gran == "ch" else "tensor")
  else:
    raise ValueError(f"spec {name!r}: granularity {gran!r}: expected g<size>, ch or t")
  for extra in parts[1:]:
    if extra == "zp":
      kw["zero_point"] = True
    elif extra in SCALE_DTYPES:
      kw["scale_dtype"] = extra
    else:
      raise ValueError(f"spec {name!r}: {extra!r}: expected zp or one of {SCALE_DTYPES}")
  return QuantSpec(weight, **kw)


@jax.tree_util.register_pytree_node_class
class Unshared:
  """A chain input (an array or a pytree, e.g. MoE's (x, group_sizes)) that every layer
  takes through its own optimization barrier (:func:`unshared`)."""

  def __init__(self, x):
    self.x = x

  def tree_flatten(self):
    return (self.x,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


def unshared(x) -> Unshared:
  """Mark x so that the layers of a chain cannot share work on it.  With one plain x,
  XLA merges the layers' identical work on it (CSE): the activation quantization of W4A8 /
  W8A8 and the MoE tile schedule ran once per call of 8 layers, not once per layer as in
  a model (H200 session 17 timelines).  Each layer instead takes (x, its params) through
  an ``optimization_barrier``: the outputs of different barriers are different values to
  XLA, and the barrier costs nothing at run time -- no copy, and no extra argument for
  the host to parse (copies of x as arguments would add ~1.7 us each: NOTES.md v19)."""
  return Unshared(x)


def first_input(x):
  """The input itself (checks and compile timings on one layer)."""
  return x.x if isinstance(x, Unshared) else x


def apply_layer(layer_fn, p, x):
  """``layer_fn(p, x)``, through the optimization barrier for :func:`unshared` x."""
  if isinstance(x, Unshared):
    xb, pb = jax.lax.optimization_barrier((x.x, p))  # both used: nothing to simplify away
    return layer_fn(pb, xb)
  return layer_fn(p, x)


def chain(layer_fn, params_list, x):
  """Apply ``layer_fn(params_i, x)`` for every params in the list (the same x, each layer
  through its own barrier for :func:`unshared` x; shapes need not chain) and return all
  outputs, so nothing is dead code."""
  return tuple(apply_layer(layer_fn, p, x) for p in params_list)


def add_chain_flags(ap, inputs: str) -> None:
  """The benchmarks' ``--shared-x`` and ``--span`` flags (``inputs``: what the layers of
  a call take, for the help text)."""
  ap.add_argument("--shared-x", action="store_true",
                  help=f"every layer of a call on one {inputs}, as before session 17 (XLA "
                       f"then merges the layers' identical work on it: the activation "
                       f"quantization, the MoE tile schedule); default: each layer takes "
                       f"it through its own barrier (unshared)")
  ap.add_argument("--span", action="store_true",
                  help="with --chain resident: also the device time per layer (a profiler "
                       "trace's span from a call's first kernel to its last, no host "
                       "dispatch: device_span_us)")


def _per_layer_us(step, layers: int, *, calls: int, repeats: int, before_repeat=None
                  ) -> dict[str, float]:
  """``step()`` dispatches one jitted call and returns what to wait on: ``calls`` of them
  back to back, then one wait, per repeat; microseconds per layer (median, min, max)."""
  per_layer = []
  for _ in range(repeats):
    if before_repeat is not None:
      before_repeat()
    t0 = time.perf_counter()
    out = None
    for _ in range(calls):
      out = step()
    jax.block_until_ready(out)
    per_layer.append((time.perf_counter() - t0) / (calls * layers) * 1e6)
  return {"us": statistics.median(per_layer), "us_min": min(per_layer),
          "us_max": max(per_layer)}


def _first_call(f, *args):
  """(result, seconds) of the first (compiling) call."""
  t0 = time.perf_counter()
  out = jax.block_until_ready(f(*args))
  return out, time.perf_counter() - t0


def time_chain(layer_fn, params_list, x, *, calls: int = 50, repeats: int = 5
               ) -> dict[str, float]:
  """Microseconds per layer (median of ``repeats``), plus the first-call (compile) time."""
  f = jax.jit(lambda ps, x: chain(layer_fn, ps, x))
  _, first = _first_call(f, params_list, x)
  jax.block_until_ready(f(params_list, x))  # warm
  res = _per_layer_us(lambda: f(params_list, x), len(params_list), calls=calls,
                      repeats=repeats)
  return {**res, "first_call_s": first}


def time_sequential(layer_fn, params_list, x, *, calls: int = 50, repeats: int = 5,
                    scale: float = 0.03) -> dict[str, float]:
  """The chain method with the layers applied in sequence, as in a model: ``x -> layer_1
  -> ... -> layer_L`` (each output times ``scale``, one small fusion, to keep values
  bounded), only the last output returned, and a donated state fed back each call, so
  every buffer keeps its address across calls (XLA re-records a Mosaic launch into its
  CUDA graph when buffers move: NOTES.md v11).  Needs layers that map x's shape to
  itself.  Microseconds per layer, as :func:`time_chain`."""
  x = first_input(x)  # the layers chain: only the first takes x
  def seq(ps, x, state):
    y = x + state
    for p in ps:
      y = layer_fn(p, y) * jnp.asarray(scale, y.dtype)
    return y

  f = jax.jit(seq, donate_argnums=2)
  state, first = _first_call(f, params_list, x, jnp.zeros_like(x))
  if state.shape != x.shape or state.dtype != x.dtype:
    raise ValueError(f"sequential chain: a layer maps {x.shape} {x.dtype} to {state.shape} "
                     f"{state.dtype}; it needs square layers (use the outputs chain)")
  held = [jax.block_until_ready(f(params_list, x, jnp.zeros_like(x)))]  # warm

  def reset():
    held[0] = jax.block_until_ready(jnp.zeros_like(x))

  def step():
    held[0] = f(params_list, x, held[0])
    return held[0]

  res = _per_layer_us(step, len(params_list), calls=calls, repeats=repeats,
                      before_repeat=reset)
  return {**res, "first_call_s": first}


def time_resident(layer_fn, params_list, x, *, calls: int = 50, repeats: int = 5,
                  span: bool = False, consume: str = "sum") -> dict[str, float]:
  """Every layer on the same x (as :func:`time_chain`), their outputs consumed inside the
  program: each output's sum is added to a donated float32 state, so the outputs live in
  XLA's temp buffer at the same addresses every call, as a layer's output does inside a
  model step (XLA re-records a Mosaic launch into its CUDA graph when its buffers move:
  NOTES.md v11).  A full sum is one more read of every output: small at decode, one HBM
  pass over M x N at large outputs (``consume="row"``: :func:`resident_program`).
  Microseconds per layer, as :func:`time_chain`; with ``span`` also ``span_us``, the
  device time per layer (:func:`device_span_us`)."""
  f = jax.jit(resident_program(layer_fn, consume), donate_argnums=2)
  state, first = _first_call(f, params_list, x, jnp.zeros((), jnp.float32))
  held = [jax.block_until_ready(f(params_list, x, state))]  # warm

  def step():
    held[0] = f(params_list, x, held[0])
    return held[0]

  res = _per_layer_us(step, len(params_list), calls=calls, repeats=repeats)
  if span:
    res["span_us"] = device_span_us(step, len(params_list))
  return {**res, "first_call_s": first}


RESIDENT_CONSUMERS = ("sum", "row")


def resident_program(layer_fn, consume: str = "sum"):
  """(params_list, x, state) -> state + the sum of every layer's output (time_resident),
  or with ``consume="row"`` of each output's first row.

  Why "row": the full sum reads the whole output once more, one HBM pass over M x N
  (H200 session 36, DeepSeek-V3 down at 4096 tokens, a 470 MB output: 123 us of wall),
  which a CUDA graph of Humming's kernels alone does not make.  With "row" the timed
  program is the kernels and the one output row read, the form comparable to Humming's
  graph (NOTES_moe.md session 36)."""
  if consume not in RESIDENT_CONSUMERS:
    raise ValueError(f"consume={consume!r}: expected one of {RESIDENT_CONSUMERS}")
  consumed = (lambda y: y) if consume == "sum" else (lambda y: y[:1])

  def run(ps, x, state):
    for p in ps:
      state = state + jnp.sum(consumed(apply_layer(layer_fn, p, x)).astype(jnp.float32))
    return state
  return run


def device_events(trace_dir: str) -> list[tuple[float, float, str]]:
  """(start_us, duration_us, name) of every kernel / copy on the GPU streams of the
  jax.profiler trace in ``trace_dir``, in start order."""
  import glob  # noqa: PLC0415
  [path] = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
  out = []
  for plane in jax.profiler.ProfileData.from_file(path).planes:
    if plane.name.startswith("/device:GPU"):
      for line in plane.lines:
        if "stream" in line.name.lower():  # not XLA's op / module lines
          out += [(e.start_ns / 1e3, e.duration_ns / 1e3, e.name) for e in line.events]
  return sorted(out)


def traced_calls(step, *, calls: int = 5) -> list[list[tuple[float, float, str]]]:
  """The GPU events of ``calls`` back-to-back ``step()`` calls (a jax.profiler trace), one
  list per call: the calls must launch the same kernels (:func:`split_calls`)."""
  import tempfile  # noqa: PLC0415
  jax.block_until_ready(step())
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      out = None
      for _ in range(calls):
        out = step()
      jax.block_until_ready(out)
    events = device_events(d)
  return split_calls(events, calls)


def split_calls(events: list[tuple[float, float, str]], calls: int
                ) -> list[list[tuple[float, float, str]]]:
  """``events`` (start order) of ``calls`` calls that each launch the same kernel sequence,
  cut into one list per call; an error if they cannot be (events of one call would be
  counted in another)."""
  if not events or len(events) % calls:
    raise RuntimeError(f"split_calls: {len(events)} GPU events for {calls} calls (expected "
                       f"the same kernels every call)")
  per = len(events) // calls
  chunks = [events[i:i + per] for i in range(0, len(events), per)]
  if any([n for _, _, n in c] != [n for _, _, n in chunks[0]] for c in chunks):
    raise RuntimeError("split_calls: the calls' kernel sequences differ (events of one "
                       "call would be counted in another)")
  return chunks


def device_span_us(step, layers: int, *, calls: int = 5) -> float:
  """Device time per layer of one call: from its first kernel's start to its last one's
  end (the kernels and the gaps between them, not the host's dispatch), from a
  jax.profiler trace of ``calls`` back-to-back ``step()`` calls; the median over calls
  divided by ``layers``.  At decode the chain's wall is the host's enqueue time when that
  is longer (JAX's argument parsing and XLA's graph launch: ~100 us per call of 8
  layers, H200 session 17); Humming's CUDA-graph replay has no such host cost, so this
  is the number comparable to it."""
  chunks = traced_calls(step, calls=calls)
  spans = [max(s + d for s, d, _ in c) - c[0][0] for c in chunks]
  return statistics.median(spans) / layers


def per_kernel_us(chunks: list[list[tuple[float, float, str]]], layers: int
                  ) -> dict[str, float]:
  """Device time per layer of each kernel name (its durations summed per call, median over
  the calls, over ``layers``) of :func:`traced_calls`' events."""
  names = dict.fromkeys(n[:60] for _, _, n in chunks[0])
  per_call = [{name: sum(d for _, d, n in c if n[:60] == name) for name in names}
              for c in chunks]
  return {name: statistics.median(t[name] for t in per_call) / layers for name in names}


CHAINS = {"outputs": time_chain, "sequential": time_sequential, "resident": time_resident}


def run_child(script: str, size: int, child_args: list[str], xla_flags: str, *,
              timeout: int, keep: tuple[str, ...] = ("size=",), last: int = 20,
              env: dict | None = None) -> None:
  """Run ``script --child size *child_args`` in a subprocess with ``XLA_FLAGS`` (read once
  per process, hence the child) and print its lines starting with ``keep`` and its errors
  (the probes of the launch cost: probe_command_buffer.py, probe_launch.py)."""
  env = {**os.environ, **(env or {}), "XLA_FLAGS": xla_flags}
  try:
    r = subprocess.run([sys.executable, script, "--child", str(size), *child_args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    lines = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith(keep) or "rror" in l]
    print("\n".join(lines[-last:]) or f"rc {r.returncode}", flush=True)
  except subprocess.TimeoutExpired:
    print(f"size={size}: timed out after {timeout} s", flush=True)


def kernel_times(fn, args, *, iterations: int = 5, per: int = 1) -> dict[str, float]:
  """Device time of each kernel ``fn(*args)`` launches, by kernel name (CUPTI, through
  ``jax.experimental.mosaic.gpu.profiler.measure``): median over ``iterations`` of the
  name's summed time per call, divided by ``per`` (e.g. the layers of a chain), in us.
  Launch gaps are not in it: compare the sum with the chain's wall clock."""
  import collections  # noqa: PLC0415
  from jax.experimental.mosaic.gpu import profiler  # noqa: PLC0415 - GPU only
  f = fn if hasattr(fn, "lower") else jax.jit(fn)
  _, per_iter = profiler.measure(f, aggregate=False, iterations=iterations)(*args)
  if iterations == 1:
    per_iter = [per_iter]
  samples = collections.defaultdict(list)
  for timings in per_iter:
    acc = collections.Counter()
    for name, ms in timings:
      acc[name[:60]] += ms * 1e3 / per
    for name, us in acc.items():
      samples[name].append(us)
  return {name: statistics.median(v) for name, v in samples.items()}


def compile_time(fn, *args) -> float:
  """Seconds from a fresh ``jax.jit(fn)`` to its first result for these arguments: trace,
  lower, XLA compile (with jax 0.11.2 the Mosaic GPU kernels compile there too) and the
  first run.  Called before the layer's first run, in case a jax caches kernels by module
  hash at run time (jaxlib's custom call keeps such a cache): H100 session 50
  (``probe_compile.py``) found the first run 1 ms and a fresh jit of an already-run layer
  within 0.09 s of the cold one, so the lower + compile numbers to session 49 stand."""
  t0 = time.perf_counter()
  jax.block_until_ready(jax.jit(lambda *a: fn(*a))(*args))  # a fresh function
  return time.perf_counter() - t0


def device_info() -> dict:
  d = jax.devices()[0]
  info = {"device": d.device_kind, "platform": d.platform, "jax": jax.__version__,
          "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
  try:
    info["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,power.draw",
         "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    pass
  return info


def write_json(name: str, payload: dict) -> Path:
  out_dir = Path(os.environ.get("OUT", RESULTS))
  out_dir.mkdir(parents=True, exist_ok=True)
  p = out_dir / name
  p.write_text(json.dumps(payload, indent=1, default=str))
  return p


def humming_available() -> bool:
  try:
    import humming  # noqa: F401
    import torch
    return torch.cuda.is_available()
  except Exception:  # noqa: BLE001 - any import problem means "not available"
    return False


def time_torch_graph(layers, x, *, calls: int = 50, repeats: int = 5) -> dict[str, float]:
  """Humming (torch) side of the chain method: the chain of layers captured in a CUDA
  graph, replayed ``calls`` times, timed with a host clock after synchronisation."""
  import torch
  t0 = time.perf_counter()
  with torch.no_grad():
    for layer in layers:
      layer(x)
  torch.cuda.synchronize()
  first = time.perf_counter() - t0
  stream = torch.cuda.Stream()
  stream.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(stream), torch.no_grad():
    for _ in range(2):
      outs = [layer(x) for layer in layers]
  torch.cuda.current_stream().wait_stream(stream)
  graph = torch.cuda.CUDAGraph()
  with torch.cuda.graph(graph), torch.no_grad():
    outs = [layer(x) for layer in layers]  # noqa: F841 - kept alive by the graph
  graph.replay()
  torch.cuda.synchronize()
  per_layer = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(calls):
      graph.replay()
    torch.cuda.synchronize()
    per_layer.append((time.perf_counter() - t0) / (calls * len(layers)) * 1e6)
  return {"us": statistics.median(per_layer), "us_min": min(per_layer),
          "us_max": max(per_layer), "first_call_s": first}


def max_rel_diff(outs, refs) -> float:
  """Largest over paired outputs of max |u - v| / max |v| (the probes' check that two
  launches of one computation agree)."""
  return max(float(np.max(np.abs(np.asarray(u, np.float32) - np.asarray(v, np.float32)))
                   / np.max(np.abs(np.asarray(v, np.float32)))) for u, v in zip(outs, refs))


def time_variant(name: str, f, args, *, per: int, interpret: bool, ref=None,
                 with_total: bool = False, err_chars: int = 80):
  """One launch variant of a probe: ``(entry, ref)`` -- the entry ``name`` and the CUPTI
  time of ``f(*args)``'s main (longest) kernel per ``per`` (and, ``with_total``, of all
  its kernels; zeros under ``interpret``), with the largest relative difference from
  ``ref`` where over 1e-3, and ``ref`` (this output when none was given).  A variant that
  does not build is an entry, not an error."""
  try:
    out = f(*args)
    t = {"interpret": 0.0} if interpret else kernel_times(f, args, per=per)
  except Exception as err:  # noqa: BLE001 - a launch shape that does not build
    return f"{name} FAILED {type(err).__name__}: {str(err)[:err_chars]}", ref
  diff = 0.0 if ref is None else max_rel_diff(out, ref)
  entry = (f"{name} {max(t.values()):6.1f}" + (f"/{sum(t.values()):6.1f}" if with_total else "")
           + (f" (diff {diff:.0e})" if diff > 1e-3 else ""))
  return entry, out if ref is None else ref


def rel_err(y, ref) -> float:
  y, ref = jnp.asarray(y, jnp.float32), jnp.asarray(ref, jnp.float32)
  return float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))


_HUMMING_LAYERS: dict = {}


def time_humming_dense(weight_config: dict, input_config: dict | None, ws, m: int, *,
                       calls: int = 50, repeats: int = 5) -> dict[str, float]:
  """humming-kernels' HummingLayer for each (K, N) weight in ``ws`` (quantized from the
  same float weights we use; Humming stores (N, K)), timed as a CUDA-graph chain."""
  import torch
  from humming.layer import HummingLayer
  k, n = ws[0].shape
  # Quantized + transformed once per (config, weights), reused across the M ladder
  # (4-bit 8192^2 x 8 layers: 256 MB per config).
  key = (repr(sorted(weight_config.items())), repr(input_config), tuple(map(id, ws)))
  layers = _HUMMING_LAYERS.get(key)
  if layers is None:
    layers = []
    for w in ws:
      layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(weight_config),
                           input_config=None if input_config is None else dict(input_config),
                           torch_dtype=torch.bfloat16).to("cuda")
      layer.load_from_unquantized(torch_from_jax(jnp.asarray(w).T))
      layer.transform()
      layers.append(layer)
    _HUMMING_LAYERS[key] = layers
  x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
  return time_torch_graph(layers, x, calls=calls, repeats=repeats)


def torch_from_jax(a):
  """A jax array as a contiguous bf16 CUDA torch tensor: on the device through DLPack
  (no host round trip: building Humming's DeepSeek-V3 weight sets through numpy took over
  110 s in session 10), through numpy where DLPack is refused."""
  import numpy as np  # noqa: PLC0415 - only the Humming baselines need these
  import torch  # noqa: PLC0415
  a = jnp.asarray(a, jnp.bfloat16)
  try:
    return torch.from_dlpack(a).contiguous()
  except Exception:  # noqa: BLE001 - e.g. a CPU array: the slow path, same values
    return torch.from_numpy(np.asarray(a.astype(jnp.float32))).to("cuda", torch.bfloat16)
