"""cuprope inside Hugging Face transformers models: ``patch_hf(model)`` and
``unpatch_hf(model)`` (re-exported by :mod:`cuprope.torch`).

* ``families.py``: the attention classes cuprope knows, their rotation
  function and q/k norm (class, rounding mode, offset, over a head or a token);
* ``ops.py``: the functions a patched attention calls in place of the
  rotation (the rotation alone, or norm + rotation fused), with transformers'
  own code as their fallback;
* ``patch.py``: the patching itself, per module instance, and its undoing.
"""
from .families import ATTENTIONS, SUPPORTED
from .patch import patch_hf, unpatch_hf

__all__ = ["patch_hf", "unpatch_hf", "ATTENTIONS", "SUPPORTED"]
