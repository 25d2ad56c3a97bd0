"""AICF on TVM: the Emit IR model (contract lattices, Emits in Relax) and its API.

Four layers (docs/design.md §8): ``aicf_tvm.core`` (lattices, contracts, kinds, facts,
the Emit encoding, errors), ``aicf_tvm.library`` (candidate Emits), ``aicf_tvm.runtime``
(the compiled model, ``load``, deploy checks) and ``aicf_tvm.driver`` (pipeline,
frontends, tuning, CLI); ``relax_passes`` and ``schedules`` sit on the core.

The core values load eagerly; the rest of the public API loads on first use through
``_LAZY``. The table stays lazy for two reasons the layering cannot remove: importing
``relax_passes`` first runs this file (its parent package) before the passes exist, so an
eager driver import here would import the passes half-built; and ``aicf_tvm.load`` must
work where TVM has only its runtime library, without Relax.
"""

from aicf_tvm.core.contract import (
    ADAM_STEP_CONTRACT,
    RELU_CONTRACT,
    ContractFacts,
    EmitContract,
    Entailment,
    PortFacts,
    entails,
)
from aicf_tvm.core.emit import EMIT_ATTR, Emit, Interface, Port, emit_of
from aicf_tvm.core.errors import (
    AicfError,
    AliasContradiction,
    ContractContradiction,
    ContractViolation,
    DeployError,
    EncodingError,
    InputError,
    KindRegistrationError,
    TargetError,
    TuningError,
    UnsupportedModelError,
)
from aicf_tvm.core.lattice import (
    ABIFact,
    AccumDtype,
    Alias,
    Alignment,
    Determinism,
    Effect,
    Flag,
    MathTag,
    NumericFact,
    Rounding,
    ShapeFact,
)
from aicf_tvm.core.options import CompileOptions
from aicf_tvm.core.version import __version__ as __version__

__all__ = [
    "ADAM_STEP_CONTRACT",
    "EMIT_ATTR",
    "RELU_CONTRACT",
    "ABIFact",
    "AccumDtype",
    "AicfError",
    "Alias",
    "AliasContradiction",
    "Alignment",
    "CompileOptions",
    "ContractContradiction",
    "ContractFacts",
    "ContractViolation",
    "DeployError",
    "Determinism",
    "Effect",
    "Emit",
    "EmitContract",
    "EncodingError",
    "Entailment",
    "Flag",
    "InputError",
    "Interface",
    "KindRegistrationError",
    "MathTag",
    "NumericFact",
    "Port",
    "PortFacts",
    "Rounding",
    "ShapeFact",
    "TargetError",
    "TuningError",
    "UnsupportedModelError",
    "emit_of",
    "entails",
]

_LAZY = {
    "contract_problems": ".driver.verify",
    "verify_contracts": ".driver.verify",
    "compile": ".driver.pipeline",
    "get_pipeline": ".driver.pipeline",
    "compile_optimizer_step": ".driver.optimizer",
    "compile_causal_lm": ".driver.llm",
    "CausalLM": ".runtime.llm",
    "CompiledModel": ".runtime.compiled",
    "explain": ".driver.explainer",
    "from_onnx": ".driver.frontends",
    "from_torch": ".driver.frontends",
    "load_model": ".driver.frontends",
    "tune": ".driver.tuning.run",
    "TuneResult": ".driver.tuning.run",
    "load": ".runtime.llm",
}
__all__ += list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name], __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'aicf_tvm' has no attribute {name!r}")
