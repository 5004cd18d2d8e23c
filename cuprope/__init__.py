"""cuprope: rotary position embedding for GPUs, exact angles, any framework.

Quick use::

    import cuprope
    cfg = cuprope.RopeConfig(rotary_dim=128)            # θ_i = 10000^(−2i/128), half split
    q_rot, k_rot = cuprope.rope_qk_forward(q, k, cfg)   # q [B, S, Hq, D], k [B, S, Hk, D]
    dq, dk = cuprope.rope_qk_backward(gq, gk, cfg)
"""
from .config import LAYOUTS, RopeConfig
from .reference import default_inv_freq
from .rope.api import rope_backward, rope_forward, rope_qk_backward, rope_qk_forward

# The public namespaces (cuprope.scaling.yarn_table, cuprope.tables...), from their
# packages; cuprope.torch and cuprope.jax are imported by name (they need the framework).
from . import schemes as scaling
from .kvcache import cos_sin_cache
from .rope import ggml, positions, tables

# Every op's kernel record (translation unit, families, name expressions),
# registered before anything compiles or lists the kernels.
from .rope import kernels as _rope_kernels  # noqa: E402,F401
from .kvcache import kernels as _kvcache_kernels  # noqa: E402,F401
from .mla import kernels as _mla_kernels  # noqa: E402,F401
from .prologue import kernels as _prologue_kernels  # noqa: E402,F401
from .qknorm import kernels as _qknorm_kernels  # noqa: E402,F401

__version__ = "0.1.0"

__all__ = [
    "RopeConfig",
    "LAYOUTS",
    "default_inv_freq",
    "rope_forward",
    "rope_backward",
    "rope_qk_forward",
    "rope_qk_backward",
    "gpu_available",
    "cos_sin_cache",
    "ggml",
    "positions",
    "scaling",
    "tables",
]


def gpu_available() -> bool:
    """True when CuPy is importable and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.is_available()
    except Exception:  # ImportError, or a CUDA driver/runtime error
        return False
