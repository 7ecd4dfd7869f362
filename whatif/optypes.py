"""The op types of a job trace and what the dependency model knows about each.

The names follow the what-if paper's artifact (``docs/whatif-method.md`` §1.2) so that its
traces load unchanged.
"""

from __future__ import annotations

from typing import Final

FORWARD_COMPUTE: Final = "forward-compute"
BACKWARD_COMPUTE: Final = "backward-compute"
FORWARD_SEND: Final = "forward-send"
FORWARD_RECV: Final = "forward-recv"
BACKWARD_SEND: Final = "backward-send"
BACKWARD_RECV: Final = "backward-recv"
PARAMS_ALL_GATHER: Final = "params-all-gather"
GRADS_REDUCE_SCATTER: Final = "grads-reduce-scatter"
SEPARATE_GRADS_ALL_REDUCE: Final = "separate-grads-all-reduce"
LAYERNORM_GRADS_ALL_REDUCE: Final = "layernorm-grads-all-reduce"
EMBEDDING_GRADS_ALL_REDUCE: Final = "embedding-grads-all-reduce"
OPTIMIZER_CLIP_MAIN_GRAD: Final = "optimizer-clip-main-grad"
OPTIMIZER: Final = "optimizer"
GC: Final = "gc"
ALL_TO_ALL: Final = "all-to-all"

COMPUTE: Final = (FORWARD_COMPUTE, BACKWARD_COMPUTE)
P2P: Final = (FORWARD_SEND, FORWARD_RECV, BACKWARD_SEND, BACKWARD_RECV)
DP_COMM: Final = (PARAMS_ALL_GATHER, GRADS_REDUCE_SCATTER, SEPARATE_GRADS_ALL_REDUCE)
OTHER_COMM: Final = (
    LAYERNORM_GRADS_ALL_REDUCE,
    EMBEDDING_GRADS_ALL_REDUCE,
    OPTIMIZER_CLIP_MAIN_GRAD,
)
INLINE_COMM: Final = (ALL_TO_ALL,)
"""Collectives on the compute path (not in the paper's model; from Kineto imports): an all-to-all
waits for the compute before it and feeds the compute after it (``docs/whatif-method.md`` §2.7)."""
COMM: Final = P2P + DP_COMM + OTHER_COMM + INLINE_COMM
"""Ops whose recorded duration includes waiting for peers; only their transfer part is kept."""

HOST: Final = (OPTIMIZER, GC)
ALL: Final = COMPUTE + P2P + DP_COMM + OTHER_COMM + HOST + INLINE_COMM
"""Every op type a canonical trace may hold (the paper's first, in the artifact's order)."""

DP_SYNCED: Final = (*DP_COMM, OPTIMIZER_CLIP_MAIN_GRAD, ALL_TO_ALL)
"""Collectives whose group spans every DP rank of the step."""

PP_COMM_GROUP: Final = {
    FORWARD_SEND: "forward-pp-comm",
    FORWARD_RECV: "forward-pp-comm",
    BACKWARD_SEND: "backward-pp-comm",
    BACKWARD_RECV: "backward-pp-comm",
}
"""Attribution by op type merges the two sides of each p2p direction (S_t, Eq. 2)."""


def attribution_group(optype: str) -> str:
    """The op-type group ``optype`` is attributed to (p2p types merged by direction)."""
    return PP_COMM_GROUP.get(optype, optype)


def is_comm(optype: str) -> bool:
    """Whether ``optype`` is a communication op (its duration splits into blocking + transfer)."""
    return optype in COMM


def is_pp_comm(optype: str) -> bool:
    """Whether ``optype`` is a pipeline-parallel point-to-point op."""
    return optype in P2P


def is_dp_comm(optype: str) -> bool:
    """Whether ``optype`` is a data-parallel gradient or parameter collective."""
    return optype in DP_COMM
