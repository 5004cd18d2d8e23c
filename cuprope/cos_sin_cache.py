"""The serving engines' cos/sin cache (build it, rotate by it in place): the
public path of :mod:`cuprope.kvcache.cos_sin_cache`, whose docstring gives
shapes and semantics (it launches the KV-cache kernel family)."""
from .kvcache.cos_sin_cache import build_cos_sin_cache, rotary_embedding

__all__ = ["build_cos_sin_cache", "rotary_embedding"]
