"""Exceptions users can hit. Every message names the model element at fault."""

from __future__ import annotations

import tvm_ffi


class AicfError(Exception):
    """Base of every error raised by AICF on purpose."""


class ContractContradiction(AicfError):
    """Two facts about the same thing meet at ⊥ (e.g. MustAlias ⊓ NoAlias)."""


class AliasContradiction(ContractContradiction):
    """MustAlias and NoAlias were both claimed for one pair of values."""

    def __init__(self, first: str, second: str | None = None, detail: str = "") -> None:
        self.first, self.second = first, second
        if second is None:  # rebuilt from its message after crossing the FFI
            super().__init__(first)
            return
        msg = f"alias contradiction: {first} says MustAlias but {second} says NoAlias"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class KindRegistrationError(AicfError, ValueError):
    """A kind registration the registry refuses: an op or kind name registered twice (the
    later entry would silently replace the earlier one), or an unknown category."""


class EncodingError(AicfError):
    """An `aicf.emit` annotation is malformed and cannot be decoded."""


class ContractViolation(AicfError):
    """`verify_contracts` found an annotation that breaks an invariant."""


class UnsupportedModelError(AicfError):
    """The model uses something the frontend or our pipeline cannot handle."""


class InputError(AicfError):
    """Run-time inputs do not match what the compiled model expects."""


class TargetError(AicfError):
    """An unknown or unusable compilation target."""


class DeployError(AicfError):
    """A file that is not an AICF module, or one built for another target."""


class TuningError(AicfError):
    """A tuning run that cannot proceed (no candidate built, corrupt database)."""


# Errors raised inside our passes cross TVM's FFI (PassContext runs them from C++):
# registering keeps their Python type on the way back out.
for _cls in (AicfError, ContractContradiction, AliasContradiction, KindRegistrationError,
             EncodingError, ContractViolation, UnsupportedModelError, InputError, TargetError,
             DeployError, TuningError):
    tvm_ffi.register_error(_cls.__name__, _cls)
