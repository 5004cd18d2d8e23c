"""The KV-cache kernel family: ``rope_append_kv``, the fused RoPE + paged
KV-cache append (``api``; its arguments checked in ``caches``, array helpers
in ``arrays``), the serving engines' cos/sin cache and vLLM's in-place
``rotary_embedding`` by it (``cos_sin_cache``, exported as
``cuprope.cos_sin_cache``; ``rotary`` beneath it, ``cache_copy`` for caches of
a third dtype, ``torch`` its custom op), the float64 reference
(``reference``) and the launch specs (``launch``).
"""
from .api import index_info, np_view, rope_append_kv, to_host, token_geometry
from .caches import KV_LAYOUTS, cache_views

__all__ = ["rope_append_kv", "KV_LAYOUTS", "token_geometry", "index_info", "to_host",
           "np_view"]
