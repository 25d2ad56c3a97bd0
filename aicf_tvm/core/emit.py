"""The Emit: kind, attrs, interface and contract, and its ``aicf.emit`` encoding.

An Emit lives in Relax as a private ``Primitive`` function whose attr ``aicf.emit``
holds ``Emit.to_attr()``: only str/int/float/bool and lists/dicts of them, so the
module round-trips through TVMScript and JSON unchanged (docs/design.md §2).
"""

from __future__ import annotations

import struct
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from .contract import ContractFacts, EmitContract
from .errors import EncodingError
from .tvm_values import to_python

if TYPE_CHECKING:
    import tvm

EMIT_ATTR = "aicf.emit"
# on a kernel: per port the alignment and contiguity it assumes (relax_passes.lower_emits)
ABI_ATTR = "aicf.abi"
# on a scheduled kernel: the rule's choices (tiles, layouts) as a line of text (aicf explain)
PLAN_ATTR = "aicf.plan"
# TVM's names: PrimFunc params every call passes a constant, and a block that only
# rewrites such a param's layout (split out and run at compile time: pre-packed weights)
LAYOUT_FREE_ATTR = "layout_free_buffers"
PREPACK_ANNOTATION = "meta_schedule.layout_rewrite_preproc"
# TVM's mark of a PrimFunc whose loops are final: no rule schedules it again
SCHEDULED_ATTR = "tirx.is_scheduled"
FORMAT_VERSION = 1

# a frozen mapping is the sorted tuple of its (key, value) pairs
AttrValue = str | int | float | bool | tuple["AttrValue", ...]


@dataclass(frozen=True)
class Port:
    """One tensor port of an Emit's interface."""

    name: str
    dtype: str
    ndim: int  # -1: unknown rank

    def to_json(self) -> list:
        return [self.name, self.dtype, self.ndim]

    @classmethod
    def from_json(cls, data) -> Port:
        name, dtype, ndim = data
        return cls(str(name), str(dtype), int(ndim))


@dataclass(frozen=True)
class Interface:
    """Inputs and outputs of an Emit, in call order."""

    inputs: tuple[Port, ...] = ()
    outputs: tuple[Port, ...] = ()

    def port_names(self) -> list[str]:
        return [p.name for p in self.inputs + self.outputs]

    def to_json(self) -> dict:
        return {"inputs": [p.to_json() for p in self.inputs], "outputs": [p.to_json() for p in self.outputs]}

    @classmethod
    def from_json(cls, data: Mapping) -> Interface:
        return cls(
            tuple(Port.from_json(p) for p in data["inputs"]),
            tuple(Port.from_json(p) for p in data["outputs"]),
        )


def freeze(value: Any) -> AttrValue:
    """Normalize TVM containers and Python containers into hashable plain values."""
    import tvm

    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, tvm.tirx.IntImm):
        return bool(value.value) if str(getattr(value, "ty", "")) == "bool" else int(value.value)
    if isinstance(value, tvm.tirx.FloatImm):
        return float(value.value)
    if isinstance(value, Mapping) or hasattr(value, "items"):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return tuple(freeze(v) for v in value)
    raise EncodingError(f"attr value {value!r} of type {type(value).__name__} is not encodable")


def exact_key(value: AttrValue) -> Hashable:
    """A hashable key of a frozen attr value under which floats are equal only bit for bit,
    as under TVM's structural equality: -0.0 is not 0.0 (``1 / x`` tells them apart) and
    a NaN equals the same NaN (Python's ``==`` says neither)."""
    if isinstance(value, float):
        return (float, struct.pack("<d", value))
    if isinstance(value, tuple):
        return tuple(exact_key(v) for v in value)
    return value


def thaw(value: AttrValue) -> Any:
    """Inverse of ``freeze`` for encoding: tuples of pairs stay lists (dicts are explicit)."""
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """An annotation value (Map/Array/String/immediates) as Python dicts/lists/scalars;
    ``EncodingError`` for anything else, None included."""
    return to_python(value, _not_encodable)


def _not_encodable(value: object) -> NoReturn:
    raise EncodingError(f"unexpected value {value!r} in an {EMIT_ATTR} annotation")


@dataclass(frozen=True)
class Emit:
    """An atomic state transformer: semantics (kind, attrs), interface and contract."""

    kind: str
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    interface: Interface = field(default_factory=Interface)
    contract: EmitContract = field(default_factory=EmitContract)
    math: str = "exact"
    op: str = ""  # the Relax op an opaque or single-op Emit stands for
    # Facts a user or frontend asserts, independent of propagation: propagation meets
    # them with what it derives and reports a contradiction (⊥) naming both.
    asserted: ContractFacts = field(default_factory=ContractFacts)

    def __post_init__(self) -> None:
        attrs = self.attrs.items() if isinstance(self.attrs, Mapping) else self.attrs
        object.__setattr__(self, "attrs", tuple(sorted((str(k), freeze(v)) for k, v in attrs)))

    @property
    def attr_dict(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    @property
    def attrs_key(self) -> Hashable:
        """The attrs as a key that tells float values apart bit for bit (``exact_key``)."""
        return exact_key(self.attrs)

    def _identity(self) -> tuple:
        return (self.kind, self.attrs_key, self.interface, self.contract, self.math, self.op, self.asserted)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Emit) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def with_contract(self, contract: EmitContract) -> Emit:
        return Emit(self.kind, self.attrs, self.interface, contract, self.math, self.op, self.asserted)

    def to_attr(self) -> dict:
        """The ``aicf.emit`` function attribute value."""
        extra = {"asserted": self.asserted.to_json()} if self.asserted != ContractFacts() else {}
        return extra | {
            "version": FORMAT_VERSION,
            "kind": self.kind,
            "op": self.op,
            "math": self.math,
            "attrs": {k: thaw(v) for k, v in self.attrs},
            "interface": self.interface.to_json(),
            "contract": self.contract.to_json(),
        }

    @classmethod
    def from_attr(cls, value: Mapping[str, Any]) -> Emit:
        data = plain(value) if not isinstance(value, dict) else value
        try:
            if int(data.get("version", -1)) != FORMAT_VERSION:
                raise EncodingError(f"{EMIT_ATTR}: unsupported format version {data.get('version')!r}")
            return cls(
                kind=str(data["kind"]),
                attrs=data.get("attrs", {}),
                interface=Interface.from_json(data["interface"]),
                contract=EmitContract.from_json(data["contract"]),
                math=str(data.get("math", "exact")),
                op=str(data.get("op", "")),
                asserted=ContractFacts.from_json(data.get("asserted", {})),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise EncodingError(f"malformed {EMIT_ATTR} annotation: {err}") from err


def is_scheduled(func: tvm.ir.BaseFunc) -> bool:
    """Whether ``func`` (a PrimFunc) carries ``SCHEDULED_ATTR``: scheduled by a rule, a
    tuned record, or by hand."""
    attrs = getattr(func, "attrs", None)
    return bool(attrs is not None and attrs.get(SCHEDULED_ATTR, False))


def emit_of(func: tvm.ir.BaseFunc) -> Emit | None:
    """The Emit a Relax function is annotated with, or None.

    Decoded once per annotation object (the passes ask again for every function at every
    sweep): the cache holds the annotation it decoded, so its address is not reused while
    the entry lives, and an Emit is immutable."""
    attrs = getattr(func, "attrs", None)
    if attrs is None or EMIT_ATTR not in attrs:
        return None
    value = attrs[EMIT_ATTR]
    key = value.__chandle__()
    hit = _DECODED.get(key)
    if hit is None:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        hit = _DECODED[key] = (value, Emit.from_attr(value))
    return hit[1]


_DECODED: dict[int, tuple[Any, Emit]] = {}  # annotation address -> (the annotation, its Emit)
_DECODED_MAX = 1 << 14
