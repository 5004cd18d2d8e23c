"""The KV-cache kernel family, all of it in this package:

* ``api.py``: ``rope_append_kv``, the fused RoPE + paged KV-cache append
  (shapes, layouts and dtypes in its docstring), its NumPy backend and launch;
* ``caches.py``: its cache, scale, addressing and ``q_out`` arguments, checked;
* ``cos_sin_cache.py``: the serving engines' cos/sin cache, built from a
  RopeConfig, and vLLM's in-place ``rotary_embedding`` by it (exported as
  ``cuprope.cos_sin_cache``); ``rotary.py``: that rotation itself, beneath
  the guarded public function and the torch custom op; ``cache_copy.py``: the
  float32 copies it reads a cache of a third dtype through (kept per tensor
  version);
* ``arrays.py``: array helpers of both (token geometry, index arrays, host views);
* ``reference.py``: the float64 NumPy reference (fp8 e4m3 quantisation,
  page/slot addressing);
* ``launch.py``: the family's launch specs for the one launcher;
* ``torch.py``: ``rotary_embedding`` as a torch custom op (re-exported by
  :mod:`cuprope.torch`).
"""
from .api import index_info, np_view, rope_append_kv, to_host, token_geometry
from .caches import KV_LAYOUTS, cache_views

__all__ = ["rope_append_kv", "KV_LAYOUTS", "token_geometry", "index_info", "to_host",
           "np_view"]
