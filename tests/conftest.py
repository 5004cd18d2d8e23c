import zlib

import numpy as np
import pytest

import cuprope

HAS_GPU = cuprope.gpu_available()


def _has(mod):
    try:
        __import__(mod)
        return True
    except Exception:
        return False


HAS_TORCH = _has("torch")
HAS_JAX = _has("jax")

# The marks of a module of GPU tests (``pytestmark = GPU_TESTS``): they build
# their tensors with torch and run only where a CUDA GPU is visible.
GPU_TESTS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU visible (CuPy absent or no device)"),
    pytest.mark.skipif(not HAS_TORCH, reason="needs torch (the GPU tests build their tensors "
                                              "with it): pip install torch"),
]


@pytest.fixture
def rng(request):
    # A different but reproducible stream per test.
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)
