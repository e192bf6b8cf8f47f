"""Imports every kernel family so it registers itself (see registry.py)."""
from humming_jax.kernels import wna16  # noqa: F401,E402
