"""Imports every kernel family so it registers itself (see registry.py)."""
from humming_jax.kernels import wna16_mgpu  # noqa: F401,E402  (4-bit on Hopper)
from humming_jax.kernels import wna16  # noqa: F401,E402
from humming_jax.kernels import w8a8  # noqa: F401,E402
from humming_jax.kernels import grouped_wna16  # noqa: F401,E402
from humming_jax.kernels import grouped_w8a8  # noqa: F401,E402
from humming_jax.kernels import grouped_wna16_mgpu  # noqa: F401,E402  (experiment)
from humming_jax.kernels import wnam_mgpu  # noqa: F401,E402  (W4A8 / W4A4 default)
from humming_jax.kernels import grouped_wnam_mgpu  # noqa: F401,E402  (W4A8 / W4A4 MoE default)
