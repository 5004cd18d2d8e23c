"""The attention modules of Hugging Face transformers that ``patch_hf`` knows:
:data:`ATTENTIONS`, one :class:`Attention` per attention class (its rotation
function, q/k norm and rounding), and the supported families. Facts from
transformers 5.24.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Attention", "ATTENTIONS", "SUPPORTED", "attention_of", "family_names"]


@dataclass(frozen=True)
class Attention:
    """One attention class: where transformers defines it, the module-level
    function its ``forward`` calls to rotate q and k, and, where the family
    norms q and k, that norm's class and its rounding in the fused op
    (``cuprope.qknorm``'s model modes, read off the norm's ``forward``):

    * ``cast_then_weight``: ``weight * (x · rsqrt)`` with the product
      rounded to the dtype first (Qwen3RMSNorm, Qwen3MoeRMSNorm);
    * ``weight_then_cast``: ``(x · rsqrt) * (offset + weight)`` in fp32,
      rounded once (Gemma3RMSNorm and the Qwen3-Next / Qwen3.5 norms with
      offset 1, Olmo2RMSNorm over the whole projection, Llama4TextL2Norm
      without a weight).

    Two families rotate in fp32 whatever the model's dtype, rounding once to
    it: OLMo 2 (fp32 cos/sin) and Llama 4 (fp32 complex ``freqs_cis``, its L2
    norm after the rotation). HF's tables cannot reach the fused op there (it
    takes tables in q's dtype, before the norm), so their rotary embedding
    (``rotary``) hands on the positions instead, and cuprope rotates by exact
    angles and rounds once: Llama 4 always, OLMo 2 where the model is not
    fp32 (an fp32 OLMo 2 keeps its tables).
    """

    family: str                  # model_type of the text model
    package: str                 # transformers.models.<package>.modeling_<package>
    cls: str                     # the attention class
    norm: str | None = None      # the q/k norm class (None: RoPE only)
    rounding: str = ""           # its model rounding mode in cuprope.qknorm
    offset: float = 0.0          # w' = offset + weight
    over: str = "head"           # "token": one norm over all heads (OLMo 2)
    rotation: str = "apply_rotary_pos_emb"  # the module-level function forward calls
    wrappers: tuple = ()         # composite model types holding this text model
    rotary: str | None = None    # the rotary embedding class that hands on positions ...
    positions: str = ""          # ... "always" or "below_fp32" (for bf16 / fp16 models)

    @property
    def module(self) -> str:
        return f"transformers.models.{self.package}.modeling_{self.package}"

    @property
    def complex_freqs(self) -> bool:
        """Llama 4: the rotary embedding hands complex ``freqs_cis``, not cos/sin."""
        return self.rotation == "apply_rotary_emb"


_QWEN3 = dict(rounding="cast_then_weight")
_ZERO_CENTRED = dict(rounding="weight_then_cast", offset=1.0)

ATTENTIONS = (
    Attention("llama", "llama", "LlamaAttention"),
    Attention("mistral", "mistral", "MistralAttention"),
    Attention("qwen2", "qwen2", "Qwen2Attention"),
    Attention("phi3", "phi3", "Phi3Attention"),
    Attention("qwen3", "qwen3", "Qwen3Attention", "Qwen3RMSNorm", **_QWEN3),
    Attention("qwen3_moe", "qwen3_moe", "Qwen3MoeAttention", "Qwen3MoeRMSNorm", **_QWEN3),
    Attention("qwen3_next", "qwen3_next", "Qwen3NextAttention", "Qwen3NextRMSNorm",
              **_ZERO_CENTRED),
    Attention("qwen3_5_text", "qwen3_5", "Qwen3_5Attention", "Qwen3_5RMSNorm", **_ZERO_CENTRED,
              wrappers=("qwen3_5",)),
    Attention("qwen3_5_moe_text", "qwen3_5_moe", "Qwen3_5MoeAttention", "Qwen3_5MoeRMSNorm",
              **_ZERO_CENTRED, wrappers=("qwen3_5_moe",)),
    Attention("gemma3_text", "gemma3", "Gemma3Attention", "Gemma3RMSNorm", **_ZERO_CENTRED,
              wrappers=("gemma3",)),
    Attention("olmo2", "olmo2", "Olmo2Attention", "Olmo2RMSNorm", rounding="weight_then_cast",
              over="token", rotary="Olmo2RotaryEmbedding", positions="below_fp32"),
    Attention("llama4_text", "llama4", "Llama4TextAttention", "Llama4TextL2Norm",
              rounding="weight_then_cast", rotation="apply_rotary_emb", wrappers=("llama4",),
              rotary="Llama4TextRotaryEmbedding", positions="always"),
)

_BY_CLASS = {(a.module, a.cls): a for a in ATTENTIONS}
# every model_type whose models hold one of these attentions (for patching a class)
SUPPORTED = frozenset([a.family for a in ATTENTIONS]
                      + [w for a in ATTENTIONS for w in a.wrappers])


def attention_of(module) -> Attention | None:
    """The :class:`Attention` of a module's own class, or None."""
    t = type(module)
    return _BY_CLASS.get((t.__module__, t.__name__))


def family_names() -> str:
    """The supported families, for messages."""
    return ", ".join(a.family for a in ATTENTIONS)
