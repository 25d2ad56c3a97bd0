"""Static reshapes legalized group by group against TOPI's kernel, in one process:
``python -m scripts.ab_static_reshapes [MODEL ...]``.

"new" is the default build: ``legalize_reshape`` indexes every reshape whose axes fall
into groups of equal extent products group by group, static shapes included.  "old"
restores, inside the same process, TOPI's kernel for static shapes, whose flattened index
a fused kernel keeps half simplified (GPT-2's ``[128, 3072] -> [1, 128, 3072]`` read the
GEMM's result at ``(j // 3072 + i) % 128``, so the GELU epilogue ran as a loop of its own
instead of inside the GEMM's tile).  Each side is built twice and their calls interleaved
(``ab_gemm_rules.compare_sides``: the ratio, the error against PyTorch and whether the
bits equal old's, per model).

MODEL: any model ``ab_gemm_rules.make`` builds.
"""

from __future__ import annotations


from scripts.ab_gemm_rules import patched_main
from tvm import relax, tirx, topi

from relax_passes import legalize_reshape as grouped
from relax_passes import lower_emits

NEW = grouped.legalize_reshape


def topi_when_static(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """The legalization before: TOPI's kernel for every reshape of static shapes."""
    x, shape = call.args
    shape = bb.lookup_binding(shape) if isinstance(shape, relax.Var) else shape
    dims = list(x.ty.shape.values) + list(shape.values) if isinstance(shape, relax.ShapeExpr) else []
    if dims and all(isinstance(d, tirx.IntImm) for d in dims):
        return bb.call_te(topi.reshape, x, shape, primfunc_name_hint="reshape")
    return NEW(bb, call)


if __name__ == "__main__":
    patched_main(__doc__, lower_emits, "legalize_reshape", topi_when_static, ["gpt2", "bert", "llama", "vit"])
