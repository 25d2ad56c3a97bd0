"""Running a compiled model: ``CompiledModel``, ``load``, the deploy checks, CPU features,
threads. Importable where TVM has only its runtime library (docs/deploy.md)."""
