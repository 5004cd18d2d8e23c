"""test_gpu_kvcache.py's check_append cases on the CPU: the same case
functions, inputs and expectations, with torch CPU tensors (the NumPy
backend). A case that cannot hold on any device (an expectation the op does
not promise, such as which of two tokens on one cache row lands, or
arguments the case did not mean, such as a head dim it never passes) fails
here before it reaches a GPU. The GPU run adds what only it can show: the
kernel's bytes."""
import pytest

pytest.importorskip("torch", reason="needs torch: pip install torch")
pytest.importorskip("ml_dtypes")

import test_gpu_kvcache as g  # noqa: E402


@pytest.mark.parametrize("dtype,cache,addressing,kv_layout", g.FUSED_PARAMS)
def test_fused_cases(dtype, cache, addressing, kv_layout):
    g.fused_case(dtype, cache, addressing, kv_layout, device="cpu")


@pytest.mark.parametrize("scheme,interleaved", g.SCHEME_PARAMS)
def test_scheme_cases(scheme, interleaved):
    g.schemes_case(scheme, interleaved, device="cpu")


@pytest.mark.parametrize("d", g.HEAD_DIMS)
def test_head_dim_cases(d):
    g.head_dims_case(d, device="cpu")


def test_unaligned_and_per_head_cases():
    g.unaligned_case(device="cpu")
    g.per_head_case(device="cpu")
