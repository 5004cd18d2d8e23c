"""Command line: ``python -m cuprope {check,bench,info}`` (each with --help).

With no command it prints the help and exits 0; a bad command or argument
prints one ``error:`` line on stderr and exits 2 (argparse's habit)."""
from __future__ import annotations

import argparse
import sys

from .cli.bench import HELP as BENCH_HELP
from .cli.check import DTYPES, MAX_HEAD_DIM, head_dim_arg

BENCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
MAX_REPS = 10_000
DESCRIPTION = """\
cuprope: rotary position embedding (RoPE) CUDA kernels, with a NumPy
backend where there is no GPU. Run a command with --help for its options.

With no command this help is printed (exit status 0). A bad command or
argument prints one "error:" line on stderr and exits with status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: ``PROG: error: MESSAGE (see PROG --help)``.
    ``commands``: the subcommands' parsers, by name."""

    commands: dict  # set by build_parser on the top-level parser

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _reps(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 1 <= n <= MAX_REPS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_REPS}, got {n}")
    return n


def _head_dim(text: str) -> int:
    try:
        return head_dim_arg(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m cuprope", description=DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", metavar="{check,bench,info}")
    parser.commands = sub.choices
    check_doc = ("apply RoPE in every supported configuration on this machine (GPU kernels, or the "
                 "NumPy backend with no GPU) and compare with the float64 reference")
    p_check = sub.add_parser(
        "check", help=check_doc,
        description=check_doc + ": forward, backward and fused q/k; both pairings (half split, "
        "interleaved); full rotary (R = D) and partial (R = D/2 rounded down to even); layouts "
        "bshd, bhsd and thd; positions up to 2^20. Prints one row per configuration and exits 1 "
        "if any row is outside its error budget (fp32 1e-6, fp16 2^-10, bf16 2^-7 of max|x|).")
    p_check.add_argument("--cpu", action="store_true",
                         help="use the NumPy backend even when a GPU is visible")
    p_check.add_argument("--head-dim", type=_head_dim, default=128, metavar="D",
                         help=f"head dim D: an even integer from 4 to {MAX_HEAD_DIM} (default 128; "
                         f"the API takes larger heads, the cap keeps the check quick)")
    p_check.add_argument("--dtype", action="append", choices=DTYPES, metavar="DTYPE",
                         help=f"check only this dtype, one of {', '.join(DTYPES)}; repeat for "
                         f"several (default: all three)")
    p_bench = sub.add_parser(
        "bench", help="time cuprope's fused q/k RoPE on this machine's GPU against a device copy "
        "of the same bytes and torch (needs a CUDA GPU and PyTorch)",
        description=BENCH_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p_bench.add_argument("--dtype", choices=tuple(BENCH_DTYPES), metavar="DTYPE",
                         help="time only this dtype: bfloat16, float16 or float32 (default: "
                         "bfloat16 cases plus one float32 case)")
    p_bench.add_argument("--reps", type=_reps, default=15, metavar="N",
                         help=f"timed repetitions per measurement, median reported: an integer "
                         f"from 1 to {MAX_REPS} (default 15)")
    p_bench.add_argument("--no-peers", action="store_true",
                         help="time cuprope and the copy only (skip torch eager, torch.compile and "
                         "the cos/sin-table path)")
    p_bench.add_argument("--no-decode", action="store_true",
                         help="skip the decode line (host and kernel time of one token)")
    p_bench.add_argument("--suite", nargs=argparse.REMAINDER, metavar="ARGS",
                         help="run instead the full benchmark suite of a source checkout "
                         "(benchmarks/bench_suite.py: every op against its peers, one CSV); "
                         "the arguments after --suite go to it, e.g. --suite --quick --only kv")
    sub.add_parser("info", help="versions, the GPU (or why none is used: CuPy not installed, no "
                   "CUDA driver, no GPU), and the kernel compile cache (location, size, how to "
                   "clear it)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser, whose --help lists its options
        parser.commands.get(args.cmd, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd is None:
        parser.print_help()
        return 0
    if args.cmd == "check":
        from .cli.check import run
        return 0 if run(use_gpu=False if args.cpu else None, head_dim=args.head_dim,
                        dtypes=tuple(dict.fromkeys(args.dtype or DTYPES))) else 1
    if args.cmd == "info":
        from .cli.info import report
        print(report())
        return 0
    if args.suite is not None:
        from .cli.bench import run_suite
        return run_suite(args.suite)
    from .cli.bench import main_short
    return main_short(dtype=BENCH_DTYPES.get(args.dtype), reps=args.reps, peers=not args.no_peers,
                      decode=not args.no_decode)


if __name__ == "__main__":
    sys.exit(main())
