"""The driver: everything that composes the core, the passes and the schedules.

The pipeline, the compiled model and its deploy format, explain, the CLI, the frontends,
tuning and the optimizer step. Only modules under here import ``relax_passes`` and
``schedules`` (docs/design.md §8). This ``__init__`` imports nothing, so that
``aicf_tvm.load`` (``driver.compiled``) runs where TVM has only its runtime.
"""
