"""The command line's verbs; ``cuprope/__main__.py`` parses the arguments and
calls them.

* ``check``: every configuration against the float64 reference, as a table;
* ``info``: versions, the GPU (or why none is used), the kernel compile cache;
* ``bench``: the short benchmark, and ``--suite``'s hand-over to the full one;
* ``bench_cases``: the timed cases and ``time_gpu``, which
  benchmarks/bench_suite.py and the other scripts there import too.
"""
