"""Our Relax passes, one per module, usable in any TVM pipeline.

FoldBatchNorm, SinkReshapes (op level) -> LiftEmits -> PropagateContracts ->
(EliminateEmits, MaterializeEmits, FuseEmits)* -> LowerEmits -> (after scheduling) prepack_weights
"""

from .eliminate_emits import EliminateEmits
from .fold_batch_norm import FoldBatchNorm
from .fuse_emits import FuseEmits
from .lift_emits import LiftEmits
from .lower_emits import LowerEmits
from .materialize_emits import MaterializeEmits
from .propagate_contracts import PropagateContracts, analyze
from .sink_reshapes import SinkReshapes

__all__ = ["EliminateEmits", "FoldBatchNorm", "MaterializeEmits", "FuseEmits", "LiftEmits", "LowerEmits", "PropagateContracts", "SinkReshapes",
           "analyze"]
