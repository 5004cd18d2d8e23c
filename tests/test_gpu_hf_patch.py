"""``cuprope.torch.patch_hf`` on the GPU: the CPU file's checks
(test_hf_patch: per-layer q/k against HF eager, logits and gradients,
generate) with cuprope's CUDA kernels and PyTorch's CUDA ones, and what only
a GPU shows: torch.compile with inductor, and static-cache generation
compiled with CUDA graphs (transformers' reduce-overhead mode)."""
import pytest

from conftest import GPU_TESTS

pytestmark = GPU_TESTS
torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
pytest.importorskip("transformers", reason="transformers is a test-only dependency")

from cuprope import torch as ctorch  # noqa: E402
from hf_tiny import FAMILIES, HYBRID, ROPE_ONLY, tiny_model  # noqa: E402
from test_hf_patch import (TOL, generate_match, layer_qk_match,  # noqa: E402
                           logits_grads_match)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_layer_q_k_on_the_gpu(family, dtype, monkeypatch):
    layer_qk_match(family, getattr(torch, dtype), monkeypatch, device="cuda")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_gradients_on_the_gpu(family, dtype, monkeypatch):
    logits_grads_match(family, getattr(torch, dtype), monkeypatch, device="cuda")


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_on_the_gpu(family, cache):
    """Eager (transformers would compile a static-cache generate on its own)."""
    generate_match(family, cache, device="cuda", disable_compile=True)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in HYBRID])
def test_static_cache_generate_with_cuda_graphs(family):
    """Static cache on CUDA: transformers compiles the decode step with
    mode="reduce-overhead" (CUDA graphs); fullgraph=True here, so a graph break
    in cuprope's ops fails. fp32, so that inductor's own roundings elsewhere
    cannot flip a greedy token between the two runs. (The hybrid models keep
    their linear-attention state in a cache of their own, not a static one.)"""
    from transformers import CompileConfig
    torch._dynamo.reset()
    generate_match(family, "static", td=torch.float32, device="cuda",
                   compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_inductor_compiles_the_patched_model(family):
    """torch.compile(fullgraph=True) with inductor: logits (and, but for the
    hybrid models, the lm_head gradient) within TOL of the eager patched
    model; for the rotation-only families (bit for bit with transformers'
    eager model), of transformers' own model compiled the same way: the
    tighter TOL is exceeded by inductor's fusions of the rest alone (0.047 of
    the largest logit for the tiny Llama on an H200). Llama 4 routes to
    both of its two experts here: at this seed two router logits of a token lie
    one bf16 ulp apart, so with top-1 routing any other rounding of the layers
    before (inductor's fusions around the op) picks the other expert (0.90 of
    the largest logit; top-2, same weights: 0.022, as transformers' own)."""
    torch._dynamo.reset()
    over = dict(num_experts_per_tok=2) if family == "llama4_text" else {}
    model = ctorch.patch_hf(tiny_model(family, torch.bfloat16, seed=4, device="cuda",
                                       **over).train())
    ref = model
    if family in ROPE_ONLY:
        ref = torch.compile(tiny_model(family, torch.bfloat16, seed=4, device="cuda").train(),
                            fullgraph=True)
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(4)).cuda()
    compiled = torch.compile(model, fullgraph=True)
    tol = TOL[torch.bfloat16] * (1 if family in ROPE_ONLY else 2)
    with torch.set_grad_enabled(family not in HYBRID):
        want = ref(ids, use_cache=False).logits
        have = compiled(ids, use_cache=False).logits
        assert (have.float() - want.float()).abs().max() <= tol * want.float().abs().max()
        if family not in HYBRID:
            w = getattr(ref, "_orig_mod", ref).lm_head.weight
            gw, = torch.autograd.grad(want.float().sum(), w)
            gh, = torch.autograd.grad(have.float().sum(), model.lm_head.weight)
            assert (gh.float() - gw.float()).abs().max() <= tol * gw.float().abs().max()
