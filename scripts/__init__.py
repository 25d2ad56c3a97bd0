"""Benchmarks, A/B runs, profiling, fuzzing and model sweeps: a package, not an install.

Run each script from the repository root as a module, ``python -m scripts.NAME ARGS``
(``--help`` lists its options). Python then puts the root on ``sys.path``, so the
scripts import our packages, ``tests`` (the fuzzer's engine, the numpy references) and
``scripts.harness`` (what they share) without path edits; no script imports another.
``bundle_runner`` is the exception by design: it is copied into the device-check bundle
as ``runner.py`` and runs there alone.
"""
