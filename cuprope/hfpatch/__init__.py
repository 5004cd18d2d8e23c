"""cuprope inside Hugging Face transformers models: ``patch_hf(model)`` and
``unpatch_hf(model)`` (re-exported by :mod:`cuprope.torch`). ``families``:
the attention classes cuprope knows (rotation function, q/k norm and its
rounding); ``ops``: the functions a patched attention calls in place of the
rotation, with transformers' own code as their fallback; ``patch``: the
patching itself, per module instance, and its undoing.
"""
from .families import ATTENTIONS, SUPPORTED
from .patch import patch_hf, unpatch_hf

__all__ = ["patch_hf", "unpatch_hf", "ATTENTIONS", "SUPPORTED"]
