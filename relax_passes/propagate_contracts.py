"""PropagateContracts: refine every Emit's contract with the facts of its call sites.

The facts come from the contract analysis (``aicf_tvm.core.propagation.analysis_of``); an Emit
function called from several sites keeps the join (the common guarantee) of its sites'
facts, met with what is asserted on it.

Runs after LiftEmits and again after every rewrite. Raises ``ContractContradiction``
when a propagated fact and an annotation meet at ⊥.
"""

from __future__ import annotations

import tvm

from aicf_tvm.core.contract import ContractFacts, EmitContract
from aicf_tvm.core.emit import EMIT_ATTR, Emit, emit_of
from aicf_tvm.core.errors import ContractContradiction
from aicf_tvm.core.propagation import analysis_of


def refine_contract(gv_name: str, emit: Emit, sites: list[ContractFacts]) -> EmitContract:
    """The Emit's contract: the join of its call sites' facts, met with what is asserted.

    The sites' facts replace earlier propagated ones (a rewrite may turn a view into a
    materialized buffer); asserted facts must agree with them or we raise.
    """
    distinct = list(dict.fromkeys(sites))  # most call sites of one Emit agree
    joined = distinct[0]
    for s in distinct[1:]:
        joined = joined.join(s)
    asserted = emit.asserted
    for port, want in asserted.ports:
        have = joined.port(port)
        shape = have.shape.meet(want.shape)
        if shape.is_bottom:
            raise ContractContradiction(
                f"Emit {gv_name} ({emit.kind}) port {port}: asserted shape {want.shape.show()} "
                f"contradicts propagated {have.shape.show()}"
            )
        joined = joined.with_port(port, have.meet(want))
    for (a, b), fact in asserted.alias:
        joined = joined.with_alias(a, b, fact.refine(joined.alias_of(a, b), f"assertion on {gv_name}",
                                                     f"propagated facts at {gv_name}"))
    return EmitContract(emit.contract.requires, joined)


@tvm.transform.module_pass(opt_level=0, name="PropagateContracts")
class PropagateContracts:
    """Store the propagated facts of ``main`` into its Emits' ``aicf.emit`` contracts."""

    def __init__(self, func_name: str = "main") -> None:
        self.func_name = func_name

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if self.func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        table = analysis_of(mod, self.func_name)
        for gv, sites in table.sites.items():
            func = mod[gv]
            emit = emit_of(func)
            contract = refine_contract(gv.name_hint, emit, sites)
            if contract != emit.contract:
                mod[gv] = func.with_attr(EMIT_ATTR, emit.with_contract(contract).to_attr())
        return mod
