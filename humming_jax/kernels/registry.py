"""The one interface between ops.py and the Pallas kernels.

A kernel family registers a :class:`DenseKernel`: which specs it runs, how it prepares the
canonical params into its own layout (once, not per call), how to undo that, and how it
runs.  ops.py picks the highest-priority registered family that supports a spec (ties: the
first registered); swapping a kernel means registering another entry, nothing else
changes.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp

from humming_jax.quantize import dequantize as dequantize_canonical
from humming_jax.quantize import unpermute_rows
from humming_jax.spec import QuantSpec


@dataclasses.dataclass(frozen=True)
class DenseKernel:
  name: str
  layout: str  # the layout name its prepared params carry
  supports: Callable[[QuantSpec], bool]
  prepare: Callable  # canonical QuantizedWeight -> prepared QuantizedWeight
  to_canonical: Callable  # prepared -> canonical
  run: Callable  # (prepared params, x (M, K), *, interpret: bool) -> (M, N)
  grouped: bool = False  # a ragged (MoE) kernel: run(params, x, group_sizes, *, interpret)
  # Specs whose GPU lowering is known to disagree with the reference (a failing
  # @pytest.mark.gpu test on the H200).  backend=None never picks the kernel for them and
  # backend="pallas" refuses them with the reason; "interpret" still runs them (CPU tests).
  gpu_known_bad: Callable[[QuantSpec], str | None] = lambda spec: None
  priority: int = 0  # higher wins when several families support a spec
  # Optional spec- and shape-dependent priority: (spec, weight shape) -> priority; the shape
  # is () when the caller does not know it (hj.prepare and quant_dense pass it).  None:
  # never the default choice for that spec (as ``opt_in``, per spec).
  priority_for: Callable[[QuantSpec, tuple[int, ...]], int | None] | None = None
  # Activation dtypes ``run`` takes (names, e.g. ("bfloat16", "float16")); None: any float.
  x_dtypes: tuple[str, ...] | None = None
  # Never chosen by ``find`` (the default choice): only by name (``hj.prepare(...,
  # kernel=)``) and by the layout of params prepared that way.  For families not yet timed
  # on the GPU, which must not become the default of a spec no other family takes.
  opt_in: bool = False
  # (prepared params, dtype) -> their weights (params.shape) in dtype, read straight from
  # this layout: the canonical dequantization, rounded to dtype once.  The XLA paths on
  # prepared params (quant_dense's backward, the XLA grouped GEMM) use it; None: through
  # to_canonical, a re-layout of every code on every call.
  dequantize: Callable | None = None
  # Rank of one weight's codes in this layout (a grouped family's: one expert stack's;
  # tests/test_recipes.py checks it against prepare): a layer stack's leading axes are
  # what its codes have beyond it (quantize.stacked_layers), and fewer dims are refused
  # (quantize.check_params).
  codes_ndim: int | None = None

  def accepts(self, x_dtype) -> bool:
    return (x_dtype is None or self.x_dtypes is None
            or jnp.dtype(x_dtype).name in self.x_dtypes)

  def rank(self, spec: QuantSpec, shape: tuple[int, ...] | None) -> int | None:
    if self.priority_for is None:
      return self.priority
    return self.priority_for(spec, tuple(shape or ()))  # () when the shape is not known


_DENSE: list[DenseKernel] = []
_GROUPED: list[DenseKernel] = []


def register(kernel: DenseKernel) -> DenseKernel:
  (_GROUPED if kernel.grouped else _DENSE).append(kernel)
  return kernel


def find(spec: QuantSpec, *, grouped: bool = False, shape: tuple[int, ...] | None = None,
         x_dtype=None) -> DenseKernel | None:
  """The registered family that runs ``spec`` (and activations of ``x_dtype`` when given):
  the highest priority (:meth:`DenseKernel.rank`: spec- and shape-dependent where the
  family says so) among those that support it; ties: the first registered.  Opt-in
  families, and families ranking the spec None, are never chosen here."""
  _load_kernels()
  found = [k for k in (_GROUPED if grouped else _DENSE)
           if not k.opt_in and k.supports(spec) and k.accepts(x_dtype)
           and k.rank(spec, shape) is not None]
  if not found:
    return None
  best = max(k.rank(spec, shape) for k in found)
  return next(k for k in found if k.rank(spec, shape) == best)


def by_name(name: str, *, grouped: bool = False) -> DenseKernel:
  """The registered family called ``name``; a ValueError lists the valid names."""
  _load_kernels()
  kernels = _GROUPED if grouped else _DENSE
  for k in kernels:
    if k.name == name:
      return k
  kind = "grouped" if grouped else "dense"
  other = [k.name for k in (_DENSE if grouped else _GROUPED)]
  hint = (f" ({name!r} is a {'dense' if grouped else 'grouped'} family: pass "
          f"grouped={not grouped})" if name in other else "")
  raise ValueError(f"kernel={name!r}: no {kind} kernel family of that name; expected one of "
                   f"{[k.name for k in kernels]}{hint}")


def layout_family(layout: str) -> str:
  """A prepared layout's name is ``family:details``; canonical is ``canonical``."""
  return layout.split(":", 1)[0]


def by_layout(layout: str) -> DenseKernel:
  _load_kernels()
  for k in _DENSE + _GROUPED:
    if k.layout == layout_family(layout):
      return k
  raise ValueError(f"unknown params layout {layout!r}")


def layout_codes_ndim(layout: str) -> int | None:
  """:attr:`DenseKernel.codes_ndim` of the family that made ``layout`` (None: unknown)."""
  _load_kernels()
  return next((k.codes_ndim for k in _DENSE + _GROUPED
               if k.layout == layout_family(layout)), None)


def to_canonical(params):
  """Canonical-layout params from params in any layout."""
  if params.layout == "canonical":
    return params
  return carrying_input_perm(by_layout(params.layout).to_canonical, params)


def dequantize(params, dtype=jnp.float32) -> jnp.ndarray:
  """The weights of params in any layout as ``dtype``: :func:`dequantize_canonical`'s float32
  values, rounded to ``dtype`` once.  Prepared params are read in their own layout where
  their family can (``DenseKernel.dequantize``), else converted to canonical first."""
  if params.layout != "canonical":
    family = by_layout(params.layout)
    if family.dequantize is None:
      params = to_canonical(params)
    else:
      w = family.dequantize(params.replace(input_perm=None), dtype)
      return unpermute_rows(w, params.input_perm)
  return dequantize_canonical(params).astype(dtype)


def carrying_input_perm(relayout: Callable, params):
  """``relayout(params)`` on params without their ``input_perm`` (act-order rows: the
  kernels and their layouts never see it; quant_dense gathers x instead), which the result
  then carries."""
  return relayout(params.replace(input_perm=None)).replace(input_perm=params.input_perm)


def _load_kernels() -> None:
  # Import for the registration side effect; kept lazy so importing the library stays cheap.
  from humming_jax.kernels import _all  # noqa: F401
