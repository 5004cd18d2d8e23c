"""Argument checks shared by the dialect modules (clear TypeError/ValueError
naming the argument; ``prefix`` says which function is speaking)."""
from __future__ import annotations

import math

import numpy as np


def as_int(v, name: str, prefix: str = "") -> int:
    """``v`` as an int; bools and non-integers are a TypeError."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{prefix}{name} must be an int, got {type(v).__name__}")
    return int(v)


def as_float(v, name: str, prefix: str = "", positive: bool = False) -> float:
    """``v`` as a finite float (and > 0 when ``positive``)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{prefix}{name} must be a number, got {type(v).__name__}") from None
    if not math.isfinite(f) or (positive and f <= 0):
        what = "a positive finite number" if positive else "finite"
        raise ValueError(f"{prefix}{name} must be {what}, got {v}")
    return f
