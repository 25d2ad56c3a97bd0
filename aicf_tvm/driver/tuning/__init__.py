"""Tuning whole models: ``run`` (``aicf_tvm.tune``: tasks, budget, database, report) and
``in_models`` (timing the tuned candidates inside the models). The kernel-level work lives
in ``schedules.tuning``."""
