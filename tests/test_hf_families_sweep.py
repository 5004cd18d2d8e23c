"""Every model type transformers ships, read by ``rope_config_from_hf``.

Each config class of ``CONFIG_MAPPING`` is built with its defaults. Where it
has RoPE parameters (its own or its ``text_config``'s):

* every key of those parameters is one cuprope reads
  (``hf_config.ROPE_PARAMETER_KEYS``) or one it knows to be no part of the
  rotation (``hf_config.OTHER_ROPE_KEYS``): a key a new transformers adds
  fails here until cuprope decides what it means;
* every ``rope_type`` is one of cuprope's schemes (or an alias), or
  ``axial`` (the vision towers' 2-D RoPE, which the reader refuses);
* ``rope_config_from_hf`` (layer 0 where the config lists layer types)
  returns a config or None, or refuses with a ValueError saying why (an
  unknown family, scheme or layer type), never another error; for a family
  of ``cuprope.schemes.hf_families`` it returns.
"""
import warnings

import pytest

pytest.importorskip("torch", reason="needs torch: pip install torch")
pytest.importorskip("transformers", reason="transformers is a test-only dependency")

from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from cuprope import RopeConfig  # noqa: E402
from cuprope.schemes import hf_config  # noqa: E402
from cuprope.schemes.hf_families import family_of  # noqa: E402
from cuprope.schemes.scaling import ROPE_TYPE_ALIASES, ROPE_TYPES  # noqa: E402

# the refusals that name their cause
REFUSALS = ("is not in cuprope's family table", "unknown rope_type", "has no RoPE parameters",
            "must be a positive even integer")
# HF's own default config of this family rotates an odd number of dims
# (head_dim = 4096 // 96 = 42, partial factor 0.5): no model ships it
DEGENERATE_DEFAULTS = {"glm4_moe"}


def _defaults():
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mt in sorted(CONFIG_MAPPING.keys()):
            try:
                out[mt] = CONFIG_MAPPING[mt]()
            except Exception:  # a few classes need arguments; nothing to read then
                continue
    return out


DEFAULTS = _defaults()


def _rope_dicts(d):
    """The rope parameter dicts of a config dict (per layer type: each)."""
    parts = [d] + ([d["text_config"]] if isinstance(d.get("text_config"), dict) else [])
    for part in parts:
        rp = part.get("rope_parameters") or part.get("rope_scaling")
        if not isinstance(rp, dict) or not rp:
            continue
        if all(v is None or isinstance(v, dict) for v in rp.values()):
            yield from (v for v in rp.values() if v)
        else:
            yield rp


def _with_rope():
    return {mt: c for mt, c in DEFAULTS.items() if any(_rope_dicts(c.to_dict()))}


WITH_ROPE = _with_rope()


def test_the_sweep_sees_the_families():
    assert len(DEFAULTS) > 500 and len(WITH_ROPE) > 200
    for mt in ("llama", "qwen3", "qwen3_next", "qwen3_5", "gemma3", "llama4", "olmo2", "phi3"):
        assert mt in WITH_ROPE


def test_every_rope_parameter_key_and_type_is_known():
    unknown, types = {}, {}
    for mt, conf in WITH_ROPE.items():
        for rp in _rope_dicts(conf.to_dict()):
            for key in set(rp) - hf_config.ROPE_PARAMETER_KEYS - set(hf_config.OTHER_ROPE_KEYS):
                unknown.setdefault(key, []).append(mt)
            t = rp.get("rope_type", rp.get("type", "default"))
            if t not in ROPE_TYPES and t not in ROPE_TYPE_ALIASES and t != "axial":
                types.setdefault(t, []).append(mt)
    assert not unknown, f"RoPE parameters cuprope does not know: {unknown}"
    assert not types, f"rope types cuprope does not know: {types}"


def _read(conf):
    types = hf_config.layer_types(conf)
    return hf_config.rope_config_from_hf(conf, layer_idx=0 if types else None)


@pytest.mark.parametrize("model_type", sorted(WITH_ROPE))
def test_reads_or_refuses_clearly(model_type):
    conf = WITH_ROPE[model_type]
    d = conf.to_dict()
    text = d["text_config"] if isinstance(d.get("text_config"), dict) else d
    reads_text = not any(d.get(k) is not None for k in ("rope_parameters", "rope_scaling"))
    known = family_of(text["model_type"] if reads_text else d["model_type"]) is not None
    try:
        cfg = _read(conf)
    except ValueError as e:
        assert any(r in str(e) for r in REFUSALS), (model_type, str(e))
        assert not known or (model_type in DEGENERATE_DEFAULTS
                             and "even integer" in str(e)), (model_type, str(e))
        return
    assert cfg is None or isinstance(cfg, RopeConfig)


@pytest.mark.parametrize("model_type", [
    "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe",
    "gemma3", "olmo2", "phi3", "llama4"])
def test_patched_families_read_every_layer(model_type):
    """The families ``cuprope.torch.patch_hf`` knows: every layer reads, the
    attention layers to a RopeConfig; None for the Gated DeltaNet layers of
    Qwen3-Next / Qwen3.5 and Llama 4's NoPE layers (its ``full_attention``)."""
    conf = DEFAULTS[model_type]
    types = hf_config.layer_types(conf) or [None] * conf.get_text_config().num_hidden_layers
    got = [hf_config.rope_config_from_hf(conf, layer_idx=i) for i in range(len(types))]
    nope = "full_attention" if model_type == "llama4" else "linear_attention"
    assert [g is None for g in got] == [t == nope for t in types]
    assert any(g is not None for g in got)
