"""Tuning the kernels: MetaSchedule tasks of the Emit PrimFuncs (``tasks``), their search
spaces (``space``), measuring (``measure``, over RPC with ``remote``), the choices of a rule
for kernels of symbolic extents (``symbolic``, ``choices``). The driver's
``aicf_tvm.driver.tuning`` runs them over whole models."""
