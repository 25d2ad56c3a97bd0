"""Kernel selection: a tuned record for the PrimFunc's workload, else the default rules.

Records come from a MetaSchedule JSON database (``database_*.json`` in a work dir).
A PrimFunc that gets a tuned schedule is marked scheduled with ``aicf.schedule =
"tuned"``, so the default-rule pass leaves it alone.
"""

from __future__ import annotations

import os
from typing import Any

import tvm
from tvm import tirx


def open_database(database: Any):
    """A MetaSchedule database from a work dir (or a database object as it is)."""
    from tvm.s_tir import meta_schedule as ms

    if not isinstance(database, (str, os.PathLike)):
        return database
    path = os.fspath(database)
    return ms.database.JSONDatabase(
        path_workload=os.path.join(path, "database_workload.json"),
        path_tuning_record=os.path.join(path, "database_tuning_record.json"),
        allow_missing=True,
    )


def apply_database(mod: tvm.IRModule, target: tvm.target.Target, database: Any) -> tvm.IRModule:
    """Replace each PrimFunc that has a tuning record by its best tuned schedule."""
    from tvm.s_tir import meta_schedule as ms

    db = open_database(database)
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        sch = db.query_schedule(tvm.IRModule({"main": func}), target=target, workload_name="main")
        if sch is None:
            continue
        updates[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("aicf.schedule", "tuned")
    del ms
    for gv, func in updates.items():
        attrs = mod[gv].attrs
        for key in ("aicf.emit", "aicf.kind"):
            if attrs is not None and key in attrs:
                func = func.with_attr(key, attrs[key])
        mod[gv] = func
    return mod
