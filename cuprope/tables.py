"""Rotation by the caller's own cos/sin tables (HF's formula): the public path
of :mod:`cuprope.rope.tables`, whose docstring gives shapes and semantics."""
from .rope.tables import (rope_qk_table_backward, rope_qk_table_forward, rope_table_backward,
                          rope_table_forward)

__all__ = ["rope_table_forward", "rope_table_backward", "rope_qk_table_forward",
           "rope_qk_table_backward"]
