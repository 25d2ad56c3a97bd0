"""The driver: everything that composes the core, the library, the passes and the schedules.

The pipeline, the frontends, explain, the CLI, tuning orchestration and the optimizer
step; ``compiled`` turns the compiler's Relax modules into a runtime ``CompiledModel``.
Only modules under here import ``relax_passes`` and ``schedules`` (docs/design.md §8).
This ``__init__`` imports nothing, so that the CLI's ``aicf run`` (which loads a library
through ``aicf_tvm.runtime``) works where TVM has only its runtime.
"""
