"""error_report: weight / output SQNR against an independent numpy oracle, worst first."""
import math

import jax
import numpy as np
import pytest

import humming_jax as hj
from humming_jax.analysis import sqnr_db


def _np_sqnr(ref, approx):
  ref, approx = np.asarray(ref, np.float64), np.asarray(approx, np.float64)
  return 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - approx) ** 2))


def _setup():
  ks = jax.random.split(jax.random.key(11), 6)
  params = {"good": {"kernel": jax.random.normal(ks[0], (128, 64)),
                     "bias": jax.random.normal(ks[1], (64,))},
            "bad": {"kernel": jax.random.normal(ks[2], (128, 64))},
            "kept": {"kernel": jax.random.normal(ks[3], (128, 64))}}
  q = hj.quantize_params(params, {"good": "w8a16", "bad": "w4a16-g128", "kept": None},
                         progress=False)
  return params, q, jax.random.normal(ks[4], (16, 128))


def test_weight_sqnr_matches_oracle_and_sorts_worst_first():
  params, q, _ = _setup()
  rep = hj.error_report(params, q)
  assert [l.path for l in rep.layers] == ["bad/kernel", "good/kernel"]  # kept: not listed
  for l in rep.layers:
    name = l.path.split("/")[0]
    w = np.asarray(params[name]["kernel"])
    w_hat = np.asarray(hj.dequantize(q[name]["kernel"]))
    assert l.weight_sqnr_db == pytest.approx(_np_sqnr(w, w_hat), abs=1e-6)
    assert l.output_sqnr_db is None
  # int8 per channel is far better than int4 g128 on gaussian weights (~6 dB per bit).
  assert rep["good"].weight_sqnr_db > rep["bad"].weight_sqnr_db + 15
  text = str(rep)
  assert "bad/kernel" in text and "weight dB" in text and text.index("bad/") < text.index(
      "good/")


def test_output_sqnr_with_inputs():
  params, q, x = _setup()
  rep = hj.error_report(params, q, inputs={"good": x, "bad/kernel": x})
  for name in ("good", "bad"):
    w = np.asarray(params[name]["kernel"], np.float64)
    b = np.asarray(params[name].get("bias", np.zeros(64)), np.float64)
    ref = np.asarray(x, np.float64) @ w + b
    # Weight-only specs: the quantized layer is x @ dequantize(q) + b.
    approx = np.asarray(x, np.float64) @ np.asarray(hj.dequantize(q[name]["kernel"]),
                                                    np.float64) + b
    assert rep[name].output_sqnr_db == pytest.approx(_np_sqnr(ref, approx), abs=0.01)
  with pytest.raises(ValueError, match="not quantized"):
    hj.error_report(params, q, inputs={"kept": x})


def test_mismatched_trees_are_errors():
  params, q, _ = _setup()
  with pytest.raises(ValueError, match="no array at 'bad/kernel'"):
    hj.error_report({"good": params["good"]}, q)


def test_sqnr_edge_cases():
  a = np.random.default_rng(0).normal(size=10)
  assert sqnr_db(a, a) == math.inf
  assert sqnr_db(np.zeros(3), np.ones(3)) == -math.inf
  assert sqnr_db(a, np.full(10, np.nan)) == -math.inf
