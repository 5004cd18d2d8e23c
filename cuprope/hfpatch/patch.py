"""``patch_hf`` / ``unpatch_hf``: cuprope's ops inside a transformers model,
patched per module instance (nothing at class level, other models untouched)
and undone by deleting the instance attributes again.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import sys
import types
import weakref

from ..schemes.hf_config import hf_rope_parameters, rope_config_from_hf
from . import ops
from .families import ATTENTIONS, SUPPORTED, attention_of, family_names

__all__ = ["patch_hf", "unpatch_hf"]

_MARK = "_cuprope_hf"            # on every patched module
_MODULE = "_cuprope_hf_module"   # on a patched attention: its forward's namespace
_CLASS_MARK = "_cuprope_hf_init"  # on a patched class: its own __init__ (or None)
_LAYER_IDS = itertools.count()
_SIGNATURES = {"apply_rotary_pos_emb": ["q", "k", "cos", "sin", "unsqueeze_dim"],
               "apply_rotary_emb": ["xq", "xk", "freqs_cis"]}


def _innermost(fn):
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return fn


def _with_globals(fn, names, module):
    """A copy of ``fn`` whose globals are ``module``'s namespace: a copy of
    ``fn``'s own with ``names`` resolving to the objects given. A wrapper
    (``functools.wraps``, the wrapped function in a closure cell) is copied
    around a copy of what it wraps."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is not None and fn.__closure__:
        new_inner, cells = None, []
        for cell in fn.__closure__:
            try:
                held = cell.cell_contents
            except ValueError:  # an empty cell
                held = None
            if held is inner:
                new_inner = new_inner or _with_globals(inner, names, module)
                cell = types.CellType(new_inner)
            cells.append(cell)
        if new_inner is not None:
            new = _copy(fn, fn.__globals__, tuple(cells))
            new.__wrapped__ = new_inner
            return new
    name = module.__name__
    module.__dict__.update(fn.__globals__)
    module.__dict__.update(names, __name__=name)
    return _copy(fn, module.__dict__, fn.__closure__)


def _copy(fn, glb, closure):
    new = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(new, fn, updated=())
    new.__dict__.pop("__wrapped__", None)
    return new


def _layer_module(attn, spec):
    """The namespace of one patched layer's forward: a module registered in
    ``sys.modules`` (torch.compile finds a function's globals through its
    module's name) until the layer is unpatched or collected."""
    name = f"{__name__}._layer{next(_LAYER_IDS)}_{spec.package}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    weakref.finalize(attn, sys.modules.pop, name, None)
    return module


def _refuse(what):
    raise ValueError(f"cuprope.torch.patch_hf: {what}")


def _check_norm(attn, spec, name, required):
    norm = getattr(attn, name, None)
    if norm is None and not required:
        return None
    if type(norm).__name__ != spec.norm:
        _refuse(f"{type(attn).__name__}.{name} is a {type(norm).__name__}, not the "
                f"{spec.norm} cuprope reproduces; nothing was changed")
    return norm


def _layer_rope(attn, spec, configs):
    """(R, exact) of a layer from its HF config: the rotated width R (HF's
    tables give the angles), and for a family whose rotary embedding hands on
    positions, the layer's RopeConfig (exact angles; None where they follow
    the sequence length); None for a layer without RoPE."""
    idx = getattr(attn, "layer_idx", None)
    try:
        p = hf_rope_parameters(attn.config, layer_idx=idx)
        if p is None or not spec.rotary:
            return None if p is None else (p["dim"], None)
        if p["rope_type"] in ("dynamic", "longrope"):
            if spec.complex_freqs:
                _refuse(f"Llama 4 with {p['rope_type']} RoPE (angles that follow the sequence "
                        f"length) is not supported; nothing was changed")
            return p["dim"], None
        cfg = rope_config_from_hf(attn.config, layer_idx=idx,
                                  layout="bshd" if spec.complex_freqs else "bhsd")
    except ValueError as e:
        if str(e).startswith("cuprope.torch.patch_hf"):
            raise
        _refuse(f"layer {idx} ({type(attn).__name__}): {e}; nothing was changed")
    key = (cfg.rotary_dim, cfg.inv_freq.tobytes(), cfg.scale, cfg.interleaved, cfg.layout)
    return p["dim"], configs.setdefault(key, cfg)


def _hf_rotary(rotaries):
    """transformers' own forward of the model's first rotary embedding of a
    class (None: none there)."""
    if not rotaries:
        return None
    rot = rotaries[0]
    return lambda x, position_ids: type(rot).forward(rot, x, position_ids)


def _attention_step(attn, spec, rotaries, configs):
    """Check one attention module; return (the function that patches it, whether
    it takes positions from the rotary embedding), or None for a layer
    without RoPE."""
    cls_forward = type(attn).forward
    inner = _innermost(cls_forward)
    if spec.rotation not in inner.__code__.co_names:
        _refuse(f"{type(attn).__name__}.forward does not call {spec.rotation} in this "
                f"transformers version; nothing was changed")
    hf_apply = inner.__globals__[spec.rotation]
    if list(inspect.signature(hf_apply).parameters) != _SIGNATURES[spec.rotation]:
        _refuse(f"{spec.module}.{spec.rotation} has an unexpected signature "
                f"{inspect.signature(hf_apply)}; nothing was changed")
    rope = _layer_rope(attn, spec, configs)
    if rope is None:
        return None
    width, exact = rope
    hf_rotary = _hf_rotary(rotaries.get(spec.rotary))
    norms = []
    if spec.complex_freqs:
        norm = _check_norm(attn, spec, "qk_norm", required=False)
        norms = [] if norm is None else [norm]
        replacement = ops.llama4_rope(norm, hf_apply, hf_rotary, exact)
    elif spec.norm:
        norms = [_check_norm(attn, spec, n, required=True) for n in ("q_norm", "k_norm")]
        if ops.eps_of(norms[0]) != ops.eps_of(norms[1]):
            _refuse(f"{type(attn).__name__}: q_norm and k_norm differ in eps; nothing was "
                    f"changed")
        replacement = ops.norm_rope(*norms, spec, hf_apply, width, exact, hf_rotary)
    else:
        replacement = ops.rope_only(hf_apply, width)

    probe = _with_globals(cls_forward, {spec.rotation: replacement},
                          types.ModuleType("cuprope layer"))
    if _innermost(probe).__globals__.get(spec.rotation) is not replacement:
        _refuse(f"{type(attn).__name__}.forward is wrapped in a way cuprope cannot see "
                f"through; nothing was changed")

    def step():
        layer = _layer_module(attn, spec)
        _set(attn, types.MethodType(_with_globals(cls_forward, {spec.rotation: replacement},
                                                  layer), attn))
        attn.__dict__[_MODULE] = layer.__name__
        for n in norms:
            _set(n, ops.identity)
    return step, exact is not None and hf_rotary is not None


def _set(module, forward):
    module.__dict__["forward"] = forward
    module.__dict__[_MARK] = True
    module.__dict__["__getstate__"] = functools.partial(_unpatched_state, module)


_OWN_KEYS = ("forward", _MARK, _MODULE, "__getstate__")


def _unpatched_state(module):
    """What a copy (copy.deepcopy, pickle) of a patched module holds: the
    module's state without the patch, so the copy is transformers' own."""
    state = type(module).__getstate__(module)
    return {k: v for k, v in state.items() if k not in _OWN_KEYS}


def _rotaries(model):
    """{class name: instances} of the rotary embeddings some family patches."""
    names = {(a.module, a.rotary) for a in ATTENTIONS if a.rotary}
    out = {}
    for m in model.modules():
        if (type(m).__module__, type(m).__name__) in names:
            out.setdefault(type(m).__name__, []).append(m)
    return out


def patch_hf(model):
    """Put cuprope's ops inside a loaded transformers model (or, given a model
    class, inside every model of it built afterwards); returns ``model``.

    Every attention module of a family cuprope knows (Llama, Mistral, Qwen2,
    Phi-3, Qwen3, Qwen3-MoE, Qwen3-Next, Qwen3.5 and its MoE, Gemma 3, OLMo 2,
    Llama 4) rotates q and k with cuprope: the rotation alone through
    ``cuprope.torch.apply_rotary_pos_emb``; where the model norms q and k, norm
    and rotation as one ``cuprope.torch.rope_qk_norm`` call in the norm's own
    rounding, forward and backward (Qwen3: per head, cast then weight; Gemma 3,
    Qwen3-Next, Qwen3.5: (1 + w), weight then cast, Qwen3-Next / Qwen3.5 on
    the strided query half of the gated projection and partial rotary, Qwen3.5
    with its multimodal sections; OLMo 2 over the whole projection; Llama 4:
    its L2 norm after the rotation).

    Exactness (CPU and GPU): q and k equal transformers' eager ones bit for
    bit, but for the norm's fp32 sum of squares, whose order is PyTorch's own
    (fp32 models: now and then one ulp), and Llama 4 and OLMo 2 below fp32,
    which transformers rotates in fp32 with fp32 angles and rounds once, where
    cuprope rotates by exact angles and rounds once. Where the fused call
    cannot reproduce transformers (tables or weights in another dtype than q,
    as under autocast with fp32 weights; tables that require grad), that layer
    runs transformers' own code for that call.

    Works under ``torch.compile`` (custom ops, no graph break), gradient
    checkpointing and CUDA graphs. Hooks on a patched norm module see its
    input unchanged (the norm happens in the fused call). A copy of the model
    (``copy.deepcopy``, pickle) is transformers' own: patch it again. A model
    (or class) without any attention cuprope knows: ValueError naming the
    supported families, nothing changed. ``unpatch_hf`` undoes it.

    Parameters
    ----------
    model : torch.nn.Module or type
        A loaded transformers model, or a ``PreTrainedModel`` subclass (a
        TypeError otherwise).

    Returns
    -------
    The same ``model``, patched.

    Notes
    -----
    How: every attention module of a known class (:mod:`.families`) gets, on
    the instance, a copy of its class's ``forward`` (and of the decorators
    around it) whose global name for the rotation (``apply_rotary_pos_emb``,
    Llama 4's ``apply_rotary_emb``) resolves to a function of :mod:`.ops`
    built for that module; transformers' code runs otherwise unchanged. Where
    the family norms q and k, the norm modules' ``forward`` becomes the
    identity on the instance (their weights stay where they are: the fused
    call reads them). The rotary embedding of Llama 4 (always) and OLMo 2
    (below fp32) hands on the positions instead of its fp32 freqs_cis / cos
    and sin (:class:`.families.Attention` says why). Each patched forward's
    namespace is a copy of its modelling module's, taken when patching (so
    changes made to that module later do not reach it), registered in
    ``sys.modules`` for torch.compile until the layer is unpatched or
    collected.
    """
    if isinstance(model, type):
        return _patch_class(model)
    found, steps, configs, positions = False, [], {}, {}
    rotaries = _rotaries(model)
    for module in model.modules():
        spec = attention_of(module)
        if spec is None:
            continue
        found = True
        if module.__dict__.get(_MARK):
            continue
        planned = _attention_step(module, spec, rotaries, configs)
        if planned is not None:
            steps.append(planned[0])
            if planned[1]:
                positions[spec.rotary] = spec.positions == "always"
    if not found:
        mt = getattr(getattr(model, "config", None), "model_type", None)
        _refuse(f"no attention module of a family cuprope knows in {type(model).__name__}"
                f"{f' (model_type {mt!r})' if mt else ''}; supported: {family_names()}; "
                f"nothing was changed")
    for name, always in positions.items():
        for rot in rotaries[name]:
            if not rot.__dict__.get(_MARK):
                steps.append(functools.partial(
                    _set, rot, ops.rotary_positions(_hf_rotary([rot]), always)))
    for step in steps:
        step()
    return model


def unpatch_hf(model):
    """Undo ``patch_hf`` on a model (every module it patched) or a model class
    (models built from then on are transformers' own); returns ``model``."""
    if isinstance(model, type):
        if _CLASS_MARK in model.__dict__:
            own = model.__dict__[_CLASS_MARK]
            if own is None:
                del model.__init__
            else:
                model.__init__ = own
            delattr(model, _CLASS_MARK)
        return model
    for module in model.modules():
        if module.__dict__.pop(_MARK, None):
            module.__dict__.pop("forward", None)
            module.__dict__.pop("__getstate__", None)
            sys.modules.pop(module.__dict__.pop(_MODULE, ""), None)
    return model


def _patch_class(cls):
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is what is being patched
        raise TypeError("cuprope.torch.patch_hf on a class needs transformers") from None
    if not issubclass(cls, PreTrainedModel):
        raise TypeError(f"cuprope.torch.patch_hf takes a transformers model or model class, "
                        f"got the class {cls.__name__}")
    mt = getattr(getattr(cls, "config_class", None), "model_type", None)
    if mt not in SUPPORTED:
        _refuse(f"{cls.__name__} (model_type {mt!r}) is no family cuprope knows; supported: "
                f"{family_names()}; nothing was changed")
    if _CLASS_MARK in cls.__dict__:
        return cls
    own, base = cls.__dict__.get("__init__"), cls.__init__

    @functools.wraps(base)
    def __init__(self, *args, **kwargs):
        base(self, *args, **kwargs)
        patch_hf(self)

    setattr(cls, _CLASS_MARK, own)
    cls.__init__ = __init__
    return cls
