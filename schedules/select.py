"""Kernel selection: a tuned record for the Emit's contract signature, else the default rules.

Records live in a MetaSchedule JSON database (``database_*.json`` in a work dir), written
by ``schedules.tuning.tasks``.  MetaSchedule keys a record by the structural hash of its workload,
so tuning and selection must query with exactly the same PrimFunc: ``workload_of`` is that
one function.  It drops our own attrs (``aicf.emit`` differs between models in facts that
do not change the kernel) and adds ``aicf.signature``, a key derived from the Emit's
contract signature (kind, attrs, port dtypes, shapes, strides, alignment, target).  The
key keeps records target-specific (MetaSchedule's JSON database ignores the target on
lookup) and one record serves every model whose Emit has the same signature.  The key
also holds the ``CompileOptions`` knobs that differ from their defaults (``option_knobs``:
every setting but the target, candidates, database, threads and verify_each_pass), so a
record tuned under other knobs (``gemm_prefetch_b_panels=False``...) is never applied to a
compile with other ones, and one tuned under the default knobs keeps the key it always had.

The database appends a row, then its newline; a run killed in between leaves an
incomplete last row.  ``open_database`` keeps every complete row: for the tuning run it
moves the incomplete one into ``<file>.torn`` (so the next append starts a new line),
for a reader it ignores it.  A bad row anywhere else is corruption: ``TuningError``, and
the file is left untouched.

``aicf_tuning.json`` next to the database says, per signature, whether a tuned record
beat the default schedule when both were measured again side by side, and names that
record (``record_digest`` of its trace); when that file exists, only the named records of
signatures it marks ``tuned`` are used, so the default rule keeps every other kernel
(including the default's own seed record of a task the budget did not reach).  A PrimFunc
that takes a record is marked scheduled with ``aicf.schedule = "tuned"`` and the
default-rule pass leaves it alone.  A kernel with symbolic extents has no record: its
entry's ``plan`` names a choice of its rule (``tune_symbolic``), which schedules it, marked
``aicf.schedule = "tuned <rule>(<choice>)"``; a choice the rule no longer offers for the
kernel keeps the default rule.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tvm
from tvm import tirx

from aicf_tvm.core.emit import is_scheduled
from aicf_tvm.core.errors import TuningError
from aicf_tvm.core.options import CompileOptions
from aicf_tvm.core.tvm_values import to_python
from schedules.tuning.choices import apply_choice, choice_label

from .cpu.conv2d_int8 import register_intrinsics
from .cpu.gemm_blocks import LAYOUT_FREE_ATTR

_LOG = logging.getLogger(__name__)

SIGNATURE_ATTR = "aicf.signature"
EMIT_ATTR = "aicf.emit"
CHOICES_FILE = "aicf_tuning.json"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
# Attrs that vary with the model a kernel comes from (or with scheduling) but not its code.
_DROPPED = (EMIT_ATTR, "aicf.kind", "aicf.schedule", "tirx.is_scheduled", "global_symbol")
_TARGET_KEYS = ("kind", "mtriple", "mcpu", "mattr", "num-cores", "arch", "max_num_threads")
# CompileOptions fields that are no knob of a kernel: the target is keyed by its own facts,
# candidates make other Emits (another signature), the rest do not change the kernel
_NOT_KNOBS = ("target", "candidates", "database", "threads", "verify_each_pass")


def option_knobs(options: CompileOptions | None) -> dict:
    """The knobs of ``options`` that differ from the defaults (the schedule rules', the
    builds', the lowering's), by field name; empty for None and the default options."""
    if options is None:
        return {}
    default = CompileOptions()
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(CompileOptions)
            if f.name not in _NOT_KNOBS and getattr(options, f.name) != getattr(default, f.name)}


def target_signature(target: tvm.target.Target) -> dict:
    """The target facts that change generated code (host CPU, cores, GPU arch)."""
    spec = target.export()
    return {k: to_python(spec[k]) for k in _TARGET_KEYS if spec.get(k) not in (None, "", [])}


def contract_signature(func: tirx.PrimFunc, target: tvm.target.Target) -> dict | None:
    """Kind, attrs, port dtypes and layout facts of the PrimFunc's Emit, plus the target.

    None when the PrimFunc carries no ``aicf.emit`` (it is not one of our kernels).
    """
    if func.attrs is None or EMIT_ATTR not in func.attrs:
        return None
    emit = to_python(func.attrs[EMIT_ATTR])
    provides = emit.get("contract", {}).get("provides", {}).get("ports", {})
    ports = []
    for name, dtype, ndim in [*emit["interface"]["inputs"], *emit["interface"]["outputs"]]:
        facts = provides.get(name, {})
        ports.append({"name": name, "dtype": dtype, "ndim": ndim,
                      "shape": facts.get("shape", {}), "abi": facts.get("abi", {})})
    return {"kind": emit["kind"], "op": emit.get("op", ""), "math": emit.get("math", "exact"),
            "attrs": emit.get("attrs", {}), "ports": ports, "target": target_signature(target)}


def signature_key(signature: dict) -> str:
    """A short stable key for a signature: ``<kind>-<16 hex digits>``."""
    text = json.dumps(signature, sort_keys=True, separators=(",", ":"))
    return f"{signature['kind']}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def replay(trace: Any, sch: tvm.s_tir.Schedule) -> None:
    """``trace`` applied to ``sch`` with its postprocessing: a tuning record (or a candidate
    of the rules) replayed, the tensor intrinsics it may name registered first."""
    register_intrinsics()
    trace.apply_to_schedule(sch, remove_postproc=False)


def record_digest(trace: Any) -> str:
    """A short stable name for a record's trace (``aicf_tuning.json`` names the chosen one)."""
    return hashlib.sha256(str(trace).encode()).hexdigest()[:16]


def workload_of(func: tirx.PrimFunc, target: tvm.target.Target,
                options: CompileOptions | None = None) -> tvm.IRModule | None:
    """The MetaSchedule workload tuned and queried for ``func``; None if not an Emit kernel.

    The workload keeps TVM's ``layout_free_buffers`` (the parameters every call passes a
    constant, ``schedules.prepack_weights.mark_layout_free``): a kernel is tuned and
    timed as it runs, on prepacked weights, and the key tells the two uses apart.  The
    knobs of ``options`` that are not the defaults (``option_knobs``) are in the key too.
    """
    signature = contract_signature(func, target)
    if signature is None:
        return None
    if func.attrs is not None and LAYOUT_FREE_ATTR in func.attrs:
        signature["layout_free"] = [int(i) for i in func.attrs[LAYOUT_FREE_ATTR]]
    knobs = option_knobs(options)
    if knobs:  # absent under the default knobs: their records keep the key they always had
        signature["options"] = knobs
    for key in _DROPPED:
        if func.attrs is not None and key in func.attrs:
            func = func.without_attr(key)
    func = func.with_attr(SIGNATURE_ATTR, signature_key(signature)).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def _is_row(line: str) -> bool:
    """Whether ``line`` is one row of a MetaSchedule JSON database file (both kinds have two
    fields: a workload's hash and IRModule, a record's workload index and record)."""
    try:
        row = json.loads(line)
        ok = isinstance(row, list) and len(row) == 2
        if ok and isinstance(row[1], str):
            base64.b64decode(row[1], validate=True)  # a workload's serialized IRModule
    except (ValueError, TypeError):
        return False
    return ok


def _check_json_lines(path: Path) -> bytes:
    """Raise TuningError naming the first complete line of ``path`` that is not a database row.

    Returns the bytes after the last newline (``b""`` when the file ends with one): the
    database appends a row and then its newline, so only a run killed while appending
    leaves them, and they are not checked here.
    """
    if not path.exists():
        return b""
    try:
        data = path.read_bytes()
        body, _, tail = data.rpartition(b"\n")
        lines = body.decode().split("\n")
    except (OSError, UnicodeDecodeError) as err:
        raise TuningError(f"tuning database {path} cannot be read: {err}") from err
    for number, line in enumerate(lines, 1):
        if line.strip() and not _is_row(line):
            raise TuningError(
                f"tuning database {path} is corrupt at line {number} ({line[:60]!r}...): "
                "it was left untouched; repair or delete that line, or use another --work-dir"
            )
    return tail


def _is_complete_row(tail: bytes) -> bool:
    """A tail that is a whole row: the run was killed between the row and its newline."""
    try:
        return _is_row(tail.decode())
    except UnicodeDecodeError:
        return False


def _set_aside_torn_tail(path: Path, tail: bytes) -> None:
    """End ``path`` at its last complete row; a torn row is appended to ``<path>.torn``.

    The torn bytes are on disk in ``.torn`` before the database file is cut, so a kill in
    between leaves them twice, never nowhere.
    """
    try:
        if _is_complete_row(tail):
            with path.open("ab") as out:
                out.write(b"\n")
            return
        torn = path.with_name(path.name + ".torn")
        with torn.open("ab") as out:
            out.write(tail + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.truncate(path, path.stat().st_size - len(tail))
    except OSError as err:
        raise TuningError(f"tuning database {path} ends in an incomplete row (a run killed while "
                          f"writing) that cannot be set aside: {err}") from err
    _LOG.warning("tuning database %s ended in an incomplete row (%d bytes; a run killed while writing): "
                 "moved it to %s, the complete rows are kept", path, len(tail), torn)


def _load_without_torn_tails(path: Path, tails: dict[str, bytes]) -> Any:
    """A JSON database of the complete rows in ``path``, which is left as it is (a tuning
    run may be appending right now).  JSONDatabase reads its files when it is made."""
    from tvm.s_tir import meta_schedule as ms

    with tempfile.TemporaryDirectory(prefix="aicf_db_") as tmp:
        for name, tail in tails.items():
            if not (path / name).exists():
                continue
            data = (path / name).read_bytes()
            if tail and not _is_complete_row(tail):
                _LOG.warning("tuning database %s ends in an incomplete row (%d bytes; a run killed "
                             "while writing, or writing now): ignored", path / name, len(tail))
                data = data[:len(data) - len(tail)]
            (Path(tmp) / name).write_bytes(data)
        return ms.database.JSONDatabase(path_workload=str(Path(tmp) / WORKLOAD_FILE),
                                        path_tuning_record=str(Path(tmp) / RECORD_FILE), allow_missing=True)


def open_database(database: Any, create: bool = False):
    """A MetaSchedule JSON database from a work dir (a database object is returned as is).

    ``create`` is for the tuning run, which appends: it makes a missing work dir and moves
    an incomplete last row (left by a run killed while appending) into ``<file>.torn``.
    Without it the files are only read, and such a row is ignored.  Raises ``TuningError``
    for a corrupt file, which is never changed, and for a missing work dir unless ``create``.
    """
    from tvm.s_tir import meta_schedule as ms

    if not isinstance(database, (str, os.PathLike)):
        return database
    path = Path(database)
    if path.exists() and not path.is_dir():
        raise TuningError(f"tuning work dir {path} is a file, not a directory")
    tails = {name: _check_json_lines(path / name) for name in (WORKLOAD_FILE, RECORD_FILE)}
    load_choices(path)
    if not path.is_dir():
        if not create:
            raise TuningError(f"no tuning database: {path} does not exist (run `aicf tune` first)")
        path.mkdir(parents=True)
    try:
        if any(tails.values()) and not create:
            return _load_without_torn_tails(path, tails)
        for name, tail in tails.items():
            if tail:
                _set_aside_torn_tail(path / name, tail)
        return ms.database.JSONDatabase(
            path_workload=str(path / WORKLOAD_FILE),
            path_tuning_record=str(path / RECORD_FILE),
            allow_missing=True,
        )
    except TuningError:
        raise
    except Exception as err:
        raise TuningError(f"tuning database in {path} cannot be loaded: {err}") from err


def load_choices(work_dir: Any) -> dict[str, dict]:
    """The per-signature tuning outcomes in ``work_dir`` (empty when there are none)."""
    path = Path(work_dir) / CHOICES_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TuningError(f"tuning summary {path} is corrupt ({err}); it was left untouched") from err
    if not isinstance(data, dict) or not isinstance(data.get("tasks", {}), dict):
        raise TuningError(f"tuning summary {path} is corrupt (not an object with 'tasks'); "
                          "it was left untouched")
    tasks = data.get("tasks", {})
    for key, entry in tasks.items():
        if not (isinstance(entry, dict) and entry.get("choice") in ("tuned", "default")
                and isinstance(entry.get("record"), (str, type(None)))):
            raise TuningError(f"tuning summary {path} is corrupt (task {key!r} has no 'choice' of "
                              "'tuned' or 'default', or a 'record' that is not a name); it was left untouched")
        if "plan" in entry and not _is_plan(entry["plan"], tuned=entry["choice"] == "tuned"):
            raise TuningError(f"tuning summary {path} is corrupt (task {key!r}, a kernel with symbolic extents: "
                              f"its 'plan' {entry['plan']!r} is not a rule name and a choice of integer and "
                              "true/false fields); it was left untouched")
    return tasks


def _is_plan(plan: Any, tuned: bool) -> bool:
    """Whether ``plan`` is a saved rule choice (``tune_symbolic``): None unless ``tuned``."""
    if plan is None:
        return not tuned
    choice = plan.get("choice") if isinstance(plan, dict) else None
    return (isinstance(plan.get("rule"), str) and isinstance(choice, dict) and bool(choice)
            and all(isinstance(k, str) and isinstance(v, (int, bool)) for k, v in choice.items()))


def restore_attrs(scheduled: tirx.PrimFunc, original: tirx.PrimFunc) -> tirx.PrimFunc:
    """``scheduled`` with the workload's attrs replaced by ``original``'s."""
    for key in (SIGNATURE_ATTR, "global_symbol"):
        if scheduled.attrs is not None and key in scheduled.attrs:
            scheduled = scheduled.without_attr(key)
    for key in (EMIT_ATTR, "aicf.kind", "global_symbol"):
        if original.attrs is not None and key in original.attrs:
            scheduled = scheduled.with_attr(key, original.attrs[key])
    return scheduled


def _chosen_schedule(db: Any, workload: tvm.IRModule, target: tvm.target.Target, record: str | None) -> Any:
    """The schedule of the record named ``record`` (``record_digest``), else the best one;
    None when there is none."""
    if record is None:
        return db.query_schedule(workload, target=target, workload_name="main")
    if not db.has_workload(workload):
        return None
    for candidate in db.get_top_k(db.commit_workload(workload), 1 << 30):
        if record_digest(candidate.trace) == record:
            sch = tvm.s_tir.Schedule(workload)
            replay(candidate.trace, sch)
            return sch
    _LOG.warning("the tuned record %s chosen for %s is not in the database: using the default rule",
                 record, workload["main"].attrs[SIGNATURE_ATTR])
    return None


def _by_choice(func: tirx.PrimFunc, target: tvm.target.Target, plan: dict, name: str,
               options: CompileOptions | None = None) -> tirx.PrimFunc | None:
    """``func`` scheduled by its rule (with the knobs of ``options``) with the saved choice
    (``tune_symbolic``), marked with it; None (and a warning) when the rule no longer offers
    that choice for it."""
    sch = apply_choice(func, target, plan, options)
    if sch is None:
        _LOG.warning("the tuned choice %s for %s is not one its rule offers for it: using the default rule",
                     choice_label(plan), name)
        return None
    return sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("aicf.schedule", choice_label(plan))


def apply_database(mod: tvm.IRModule, target: tvm.target.Target, database: Any,
                   choices: Mapping[str, dict] | None = None,
                   options: CompileOptions | None = None) -> tvm.IRModule:
    """Replace each Emit PrimFunc whose signature has a winning record by its tuned schedule.

    ``choices`` (per signature, as in ``aicf_tuning.json``) replaces the work dir's own:
    tuning builds its model variants so (``aicf_tvm.driver.tuning.in_models``).  Records
    are looked up under the knobs of ``options`` (``workload_of``): only those tuned with
    the same knobs apply."""
    db = open_database(database)
    from_dir = isinstance(database, (str, os.PathLike))
    judged = choices is not None or (from_dir and (Path(database) / CHOICES_FILE).exists())
    if choices is None:
        choices = load_choices(database) if from_dir else {}
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
            continue
        workload = workload_of(func, target, options)
        if workload is None:
            continue
        key = str(workload["main"].attrs[SIGNATURE_ATTR])
        choice = choices.get(key, {})
        if judged and choice.get("choice") != "tuned":
            continue  # not measured faster than the default rule (or not tuned): keep the rule
        if choice.get("plan") is not None:  # symbolic extents: the rule schedules by the choice
            scheduled = _by_choice(func, target, choice["plan"], gv.name_hint, options)
            if scheduled is not None:
                updates[gv] = scheduled
            continue
        try:
            sch = _chosen_schedule(db, workload, target, choice.get("record"))
        except Exception as err:  # noqa: BLE001 - a record whose trace no longer replays
            # Kernel selection falls through to the default rule rather than failing the build.
            _LOG.warning("tuned record for %s does not replay (%s): using the default rule",
                         gv.name_hint, str(err).splitlines()[0][:200])
            continue
        if sch is None:
            continue
        scheduled = restore_attrs(sch.mod["main"], func)
        updates[gv] = scheduled.with_attr("tirx.is_scheduled", True).with_attr("aicf.schedule", "tuned")
    for gv, func in updates.items():
        mod[gv] = func
    return mod
