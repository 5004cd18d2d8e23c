"""The registry of the constants the kernels share with the host (codes) and
of the tuning values they compile with: each op's kernel record declares its
own (``kernels.register``). Every one reaches the kernels as a ``-D`` option
(``loader.compile_options``), the headers keep no defaults (each op's
header checks its own), and the host reads the same merged values, so the
two cannot disagree."""
from __future__ import annotations

import os

CODES: dict[str, int] = {}            # declared by the records: declare_codes
TUNING_DEFAULTS: dict[str, int] = {}  # declared by the records: declare_tuning


def _overrides(text: str) -> dict[str, str]:
    """``NAME=value`` tokens of CUPROPE_KERNEL_DEFINES (a bare ``NAME``: ``-DNAME``)."""
    out = {}
    for tok in text.split():
        name, _, value = tok.partition("=")
        if name in CODES:
            raise ValueError(f"CUPROPE_KERNEL_DEFINES: {name} is a code the host and kernels "
                             f"share, not a tuning value")
        out[name] = value
    return out


# The tuning values in effect: CUPROPE_KERNEL_DEFINES (e.g. "CUPROPE_ROWS16=2
# CUPROPE_MIN_BLOCKS=3"), read once, then each declared default not
# overridden. The kernels' -D options and the host's values both come from here.
_OVERRIDES = _overrides(os.environ.get("CUPROPE_KERNEL_DEFINES", ""))
TUNING: dict[str, str] = dict(_OVERRIDES)


def declare_codes(codes: dict[str, int]) -> None:
    """Add an op's codes (its kernel record's) to CODES. A code cannot be
    overridden, and a name declared again must keep its value."""
    for name, value in codes.items():
        if name in _OVERRIDES:
            raise ValueError(f"CUPROPE_KERNEL_DEFINES: {name} is a code the host and kernels "
                             f"share, not a tuning value")
        old = CODES.get(name)
        if old is not None and old != value:
            raise ValueError(f"code {name} declared as {old} and as {value}")
        CODES[name] = value


def declare_tuning(defaults: dict[str, int]) -> None:
    """Add an op's tuning values (its kernel record's) to TUNING_DEFAULTS and
    TUNING, where an override from CUPROPE_KERNEL_DEFINES stays in effect. A
    name declared again must keep its value."""
    for name, value in defaults.items():
        old = TUNING_DEFAULTS.get(name)
        if old is not None and old != value:
            raise ValueError(f"tuning value {name} declared as {old} and as {value}")
        TUNING_DEFAULTS[name] = value
        TUNING.setdefault(name, str(value))


def tuning(name: str) -> int:
    """One tuning value in effect, as the kernels compile with it."""
    try:
        return int(TUNING[name])
    except KeyError:
        raise KeyError(f"no tuning value {name}: no kernel record declares it") from None
