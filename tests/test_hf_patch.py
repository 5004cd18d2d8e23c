"""``cuprope.torch.patch_hf`` on tiny random models of every family it knows,
on the CPU (cuprope's ops run their NumPy emulation of the GPU roundings).

Exactness, against the same model unpatched (transformers' eager code):

* each attention layer's q and k, fed the same inputs: bit for bit in bf16;
  in fp32 bit for bit for the families without a q/k norm, while the fused
  norm's fp32 sum of squares adds in its own order where PyTorch adds in
  another: the elements that differ (counted) are within 4 ulp of the
  tensor's largest. Llama 4 (and OLMo 2 below fp32) rotates by exact angles
  where transformers uses fp32 ones: fp32 within 2^-18 of the largest, bf16
  at most 0.5% of the elements one ulp apart;
* the whole model's logits and every parameter's gradient: bit for bit for
  the families without a norm; with one, within TOL (fp32 2e-5, bf16 2^-5,
  of the tensor's largest magnitude);
* ``generate`` (greedy, left-padded batch, dynamic and static cache): the same
  tokens.

Also: torch.compile(fullgraph=True) traces the patched model with cuprope's
custom ops in the graph, gradient checkpointing, the fallback under autocast,
class patching, undoing, and the refusal of a model cuprope does not know.
"""
import gc
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
pytest.importorskip("transformers", reason="transformers is a test-only dependency "
                                           "(pip install .[test])")

from cuprope import torch as ctorch  # noqa: E402
from cuprope.hfpatch import ops  # noqa: E402
from hf_tiny import (FAMILIES, HYBRID, ROPE_ONLY, attention_inputs, capture_qk,  # noqa: E402
                     tiny_config, tiny_model)
from torch_helpers import count_calls  # noqa: E402

TOL = {torch.float32: 2e-5, torch.bfloat16: 2.0 ** -5}
# the layers with RoPE in the tiny models (the others: Gated DeltaNet, Llama 4's NoPE)
ROPE_LAYERS = {f: (1 if f in HYBRID or f == "llama4_text" else 2) for f in FAMILIES}
FUSED = {f: ("apply_rotary_pos_emb" if f in ROPE_ONLY else "rope_qk_norm") for f in FAMILIES}


def _ids(seed, b=2, s=11):
    return torch.randint(0, 128, (b, s), generator=torch.Generator().manual_seed(seed))


def _fused_calls(monkeypatch, family):
    return count_calls(monkeypatch, ops, FUSED[family])


def _layer_qk(model, inputs, pos_embeddings=None):
    """q, k of every attention layer called on ``inputs`` (the unpatched run's),
    with the position embeddings of ``pos_embeddings`` where given."""
    def run():
        with torch.no_grad():
            for attn, (args, kw) in inputs.items():
                if pos_embeddings is not None:
                    kw = dict(kw, position_embeddings=pos_embeddings[attn][1]
                              ["position_embeddings"])
                attn(*args, **kw)
    return capture_qk(model, run)


def layer_qk_match(family, td, monkeypatch, device="cpu"):
    """Each attention layer of a tiny ``family`` model in ``td``, fed the same
    inputs unpatched and patched: q and k as the module docstring states."""
    model = tiny_model(family, td, seed=1, device=device)
    ids = _ids(1).to(device)
    model.config.use_cache = False
    inputs = attention_inputs(model, ids)
    ref = _layer_qk(model, inputs)
    ctorch.patch_hf(model)
    positions = attention_inputs(model, ids)  # Llama 4's position embeddings: the positions
    calls = _fused_calls(monkeypatch, family)
    got = _layer_qk(model, inputs, positions)
    assert len(calls) == ROPE_LAYERS[family] and len(got) == len(ref) == len(inputs)
    counts = []
    for (layer, q0, k0), (_, q1, k1) in zip(ref, got):
        for want, have in ((q0, q1), (k0, k1)):
            assert have.dtype == want.dtype and have.shape == want.shape
            diff = (have.float() - want.float()).abs()
            top = want.float().abs().max()
            n = int((have != want).sum())
            counts.append(n)
            if family == "llama4_text" and td == torch.float32:
                assert diff.max() <= 2.0 ** -18 * top, (layer, float(diff.max()))
            elif family == "llama4_text" or family == "olmo2" and td == torch.bfloat16:
                assert n <= 0.005 * want.numel() and diff.max() <= 2.0 ** -7 * top, (layer, n)
            elif td == torch.float32 and family not in ROPE_ONLY:  # the fp32 sum order
                assert n <= 0.3 * want.numel() and diff.max() <= 2.0 ** -21 * top, (layer, n)
            else:
                assert n == 0, (layer, n, float(diff.max()))
    return counts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_layer_q_k_are_hf_eager(family, dtype, monkeypatch):
    td = getattr(torch, dtype)
    counts = layer_qk_match(family, td, monkeypatch)
    if td == torch.float32 and family not in ROPE_ONLY:
        assert sum(counts) > 0  # the exception is real here (and counted)


def _grads(model, ids, probe):
    model.zero_grad()
    (model(ids).logits.float() * probe).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def logits_grads_match(family, td, monkeypatch, device="cpu"):
    """The logits and every parameter's gradient of a tiny ``family`` model in
    ``td``, patched against unpatched (module docstring)."""
    model = tiny_model(family, td, seed=2, device=device).train()
    ids = _ids(2).to(device)
    probe = torch.randn(2, 11, 128, generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        ref_logits = model(ids).logits
    ref = _grads(model, ids, probe)
    calls = _fused_calls(monkeypatch, family)
    ctorch.patch_hf(model)
    with torch.no_grad():
        logits = model(ids).logits
    got = _grads(model, ids, probe)
    assert len(calls) == 2 * ROPE_LAYERS[family]
    assert got.keys() == ref.keys()
    exact = family in ROPE_ONLY
    pairs = [("logits", logits, ref_logits)] + [(n, got[n], ref[n]) for n in ref]
    for name, have, want in pairs:
        if exact:
            assert torch.equal(have, want), name
        else:
            err = (have.float() - want.float()).abs().max()
            assert err <= TOL[td] * want.float().abs().max(), (name, float(err))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_gradients_match_unpatched(family, dtype, monkeypatch):
    logits_grads_match(family, getattr(torch, dtype), monkeypatch)


def generate_match(family, cache, td=torch.bfloat16, device="cpu", **extra):
    """Greedy ``generate`` of a tiny ``family`` model on a left-padded batch
    (positions differ per row): the same tokens patched and unpatched.
    ``extra``: more keyword arguments of ``generate``."""
    model = tiny_model(family, td, seed=3, device=device)
    ids = _ids(3, s=7).to(device)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    kw.update(extra)
    try:
        ref = model.generate(ids, **kw)
    except TypeError as e:  # before any patching: transformers' own code (e.g. 5.17's Llama 4)
        import transformers
        pytest.skip(f"transformers {transformers.__version__}'s own generate fails on this "
                    f"model before patching: {e}")
    ctorch.patch_hf(model)
    got = model.generate(ids, **kw)
    assert torch.equal(got, ref), (got, ref)


@pytest.mark.parametrize("cache", ["dynamic", pytest.param("static", marks=pytest.mark.slow)])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_generate_gives_the_same_tokens(family, cache):
    generate_match(family, cache)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_torch_compile_traces_the_patched_model_whole(family):
    """fullgraph=True: no graph break; cuprope's custom op is in the graph;
    the compiled model's logits (and gradients, but for the hybrid models,
    whose Gated DeltaNet transformers cannot compile a backward of here) are
    the eager patched model's."""
    torch._dynamo.reset()
    model = ctorch.patch_hf(tiny_model(family, torch.bfloat16, seed=4).train())
    ids = _ids(4)
    seen = set()

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.set_grad_enabled(family not in HYBRID):
        want = model(ids, use_cache=False).logits
        if family not in HYBRID:
            want_g = torch.autograd.grad(want.float().sum(), model.lm_head.weight)
        have = compiled(ids, use_cache=False).logits
        if family not in HYBRID:
            have_g = torch.autograd.grad(have.float().sum(), model.lm_head.weight)
            assert torch.equal(have_g[0], want_g[0])
    assert torch.equal(have, want)
    op = "cuprope.rope_qk_table" if family in ROPE_ONLY else "cuprope.rope_qk_norm"
    assert any(t.startswith(op) for t in seen), sorted(t for t in seen if "cuprope" in t)


@pytest.mark.parametrize("family", ["llama", "qwen3", "olmo2", "llama4_text"])
def test_gradient_checkpointing(family):
    model = ctorch.patch_hf(tiny_model(family, torch.float32, seed=5).train())
    ids = _ids(5)
    probe = torch.randn(2, 11, 128, generator=torch.Generator().manual_seed(5))
    ref = _grads(model, ids, probe)
    # transformers 5.2x renamed gradient checkpointing to activation checkpointing
    new_name = hasattr(model, "activation_checkpointing_enable")
    (model.activation_checkpointing_enable if new_name else model.gradient_checkpointing_enable)()
    got = _grads(model, ids, probe)
    on = model.is_activation_checkpointing if new_name else model.is_gradient_checkpointing
    assert on and got.keys() == ref.keys()
    for n in ref:
        assert torch.equal(got[n], ref[n]), n


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text", "phi3"])
def test_autocast_falls_back_to_transformers(family, monkeypatch):
    """fp32 weights under bf16 autocast: q arrives in bf16, the tables in fp32
    (HF promotes): no fused call, transformers' own result."""
    model = tiny_model(family, torch.float32, seed=6)
    ids = _ids(6)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(ids).logits
        calls = _fused_calls(monkeypatch, family)
        ctorch.patch_hf(model)
        got = model(ids).logits
    assert not calls
    assert torch.equal(got, ref)


def _patched(model):
    return [m for m in model.modules() if "forward" in m.__dict__]


def test_patch_is_per_instance_idempotent_and_undone():
    a, b = tiny_model("qwen3", torch.float32, 7), tiny_model("qwen3", torch.float32, 7)
    ids = _ids(7)
    with torch.no_grad():
        ref = a(ids).logits
    assert ctorch.patch_hf(a) is a
    names = [m._cuprope_hf_module for m in a.modules() if "_cuprope_hf_module" in m.__dict__]
    assert len(names) == 2 and all(n in sys.modules for n in names)
    assert len(_patched(a)) == 6 and not _patched(b)  # 2 attentions, 2 × (q_norm, k_norm)
    forwards = [m.forward for m in _patched(a)]
    ctorch.patch_hf(a)  # again: nothing new
    assert [m.forward for m in _patched(a)] == forwards
    assert ctorch.unpatch_hf(a) is a
    assert not _patched(a) and not any(n in sys.modules for n in names)
    with torch.no_grad():
        assert torch.equal(a(ids).logits, ref)
    ctorch.patch_hf(b)
    names = [m._cuprope_hf_module for m in b.modules() if "_cuprope_hf_module" in m.__dict__]
    del b
    gc.collect()
    assert not any(n in sys.modules for n in names)  # a collected model leaves nothing


def test_a_copy_of_a_patched_model_is_transformers_own():
    """copy.deepcopy and pickle (torch.save of a whole model) copy the functions
    of the patch by reference, which would tie the copy to the original's norm
    modules: the copy comes out unpatched instead, and computes HF's result."""
    import copy
    import io
    model = tiny_model("qwen3", torch.float32, 9)
    ids = _ids(9)
    ctorch.patch_hf(model)
    twin = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert len(_patched(model)) == 6 and not _patched(twin) and not _patched(loaded)
    with torch.no_grad():
        for m in (twin, loaded):
            m.model.layers[0].self_attn.q_norm.weight.mul_(2.0)  # the copy's own weights count
        want = ctorch.unpatch_hf(copy.deepcopy(twin))(ids).logits
        assert torch.equal(twin(ids).logits, want) and torch.equal(loaded(ids).logits, want)
        assert not torch.equal(model(ids).logits, want)


def test_unknown_model_is_refused_and_left_unchanged():
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match=r"no attention module of a family cuprope knows in "
                                         r"GPT2LMHeadModel \(model_type 'gpt2'\); supported: "
                                         r"llama, mistral, .*llama4_text; nothing was changed"):
        ctorch.patch_hf(model)
    assert not _patched(model)
    with pytest.raises(ValueError, match="GPT2LMHeadModel .* is no family cuprope knows"):
        ctorch.patch_hf(GPT2LMHeadModel)
    assert "_cuprope_hf_init" not in GPT2LMHeadModel.__dict__
    with pytest.raises(TypeError, match="takes a transformers model or model class"):
        ctorch.patch_hf(torch.nn.Linear)


def test_a_norm_module_it_does_not_reproduce_is_refused():
    model = tiny_model("qwen3", torch.float32, 8)
    model.model.layers[1].self_attn.k_norm = torch.nn.LayerNorm(32)
    with pytest.raises(ValueError, match="k_norm is a LayerNorm, not the Qwen3RMSNorm"):
        ctorch.patch_hf(model)
    assert not _patched(model)  # layer 0 passed its checks, and was not patched either


def test_patch_a_class_before_loading():
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM
    own = Qwen3ForCausalLM.__init__
    ctorch.patch_hf(Qwen3ForCausalLM)
    try:
        ctorch.patch_hf(Qwen3ForCausalLM)  # again: once
        model = AutoModelForCausalLM.from_config(tiny_config("qwen3"))
        assert type(model) is Qwen3ForCausalLM and len(_patched(model)) == 6
    finally:
        ctorch.unpatch_hf(Qwen3ForCausalLM)
    assert Qwen3ForCausalLM.__init__ is own
    assert not _patched(AutoModelForCausalLM.from_config(tiny_config("qwen3")))
    assert len(_patched(model)) == 6  # built while patched: still patched
