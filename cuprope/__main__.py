"""Command line: ``python -m cuprope {check,bench,info}`` (each with --help)."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cuprope", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_check = sub.add_parser("check", help="apply RoPE in every supported configuration on this "
                             "machine (GPU kernels, or the NumPy backend with no GPU) and compare "
                             "with the float64 reference")
    p_check.add_argument("--cpu", action="store_true", help="force the NumPy backend")
    p_check.add_argument("--head-dim", type=int, default=128)
    sub.add_parser("bench", help="short roofline benchmark on this machine's GPU (needs torch): "
                   "cuprope vs a device copy and torch, with a progress bar")
    sub.add_parser("info", help="versions, devices, and the kernel compile cache (location, size, "
                   "how to clear it)")
    args = parser.parse_args(argv)
    if args.cmd == "check":
        from .check import run
        return 0 if run(use_gpu=False if args.cpu else None, head_dim=args.head_dim) else 1
    if args.cmd == "info":
        from .info import report
        print(report())
        return 0
    if args.cmd == "bench":
        from .bench import main_short
        return main_short()
    return 2


if __name__ == "__main__":
    sys.exit(main())
