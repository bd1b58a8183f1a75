"""Fused Adam(W) update of one parameter as an NKI kernel for trn1 (NeuronCore-v2), NKI 0.3+ API.

Spec: frontier_jax.ops.reference.adam_update (optax.scale_by_adam -> scale by -lr -> apply_updates, plus
optional decoupled weight decay as optax.add_decayed_weights before the learning rate):
    m' = (1 - b1) g + b1 m                v' = (1 - b2) g^2 + b2 v
    u  = (m' / bc1) / (sqrt(v' / bc2) + eps) + wd * p
    p' = p - lr * u                       (bc1 = 1 - b1^t, bc2 = 1 - b2^t)
One pass over HBM: p, g, m, v are each read once and p', m', v' written once (7 accesses per
element, the minimum), plus one [128, 4] fp32 tensor of runtime scalars (lr, bc1, bc2, unused),
every row identical, so the schedule and the step count never recompile the kernel.

Layout: the flat [N] parameter is viewed as [128, N // 128] (all partitions busy) and walked in free
chunks of FREE_TILE elements; the N % 128 leftover elements form one [1, tail] tile. Math in fp32
on VectorE/ScalarE, each state rounded once on the write to its own dtype (bf16 moments stay bf16).
The kernel is DMA-bound: ~10 engine instructions per chunk against 7 transfers.

NeuronCore-v2 (trn1) rules this kernel follows (AWS docs, aws-neuron-sdk): ScalarE sqrt is valid only
on [2^-116, 2^118] (nki/api/nki.api.shared.rst, activation functions table), and v' is exactly 0
wherever g and v are (e.g. the first step of a parameter with a zero gradient), so the sqrt computes
sqrt(v' / bc2 + 2^-116): that leaves any v' / bc2 >= 2^-91 unchanged (2^-116 is below half its fp32
ulp) and moves sqrt by at most 2^-58 ~ 3.5e-18, less than half an fp32 ulp of sqrt(.) + eps >= 1e-8;
the upper end holds for |g| < 2^58. The bias is an [N, 1] tile (v2 takes no
immediate bias: nki/api/nki/isa/__init__.py, activation "Layout"); `tensor_scalar` /
`scalar_tensor_tensor` operands are fp32 immediates or [N, 1] fp32 columns (isa docs); the 1 / x is
VectorE's precise reciprocal of a value >= eps (nki.api.shared.rst, engine selection).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from kernels_nki.tiles import row_tiles

FREE_TILE = 1024  # fp32 elements per partition per chunk: 4 KiB per tile, ~9 tiles live
SQRT_MIN = 2.0 ** -116  # lower end of ScalarE sqrt's valid input range (nki/api/nki.api.shared.rst)


def _adam_tile(p_RW, g_RW, m_RW, v_RW, po_RW, mo_RW, vo_RW, nlr, rbc1, rbc2, floor, b1, b2, eps, weight_decay):
    """One [R, W] chunk (R <= 128): load 4, compute, store 3. Scalars are [R, 1] columns."""
    R, W = p_RW.shape
    p_t = nl.ndarray((R, W), dtype=p_RW.dtype, buffer=nl.sbuf)
    g_t = nl.ndarray((R, W), dtype=g_RW.dtype, buffer=nl.sbuf)
    m_t = nl.ndarray((R, W), dtype=m_RW.dtype, buffer=nl.sbuf)
    v_t = nl.ndarray((R, W), dtype=v_RW.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=p_t, src=p_RW)
    nisa.dma_copy(dst=g_t, src=g_RW)
    nisa.dma_copy(dst=m_t, src=m_RW)
    nisa.dma_copy(dst=v_t, src=v_RW)
    # first moment: (1 - b1) g on ScalarE, + b1 m on VectorE
    t_f = nl.ndarray((R, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=t_f, op=nl.copy, data=g_t, scale=1.0 - b1)
    m2 = nl.ndarray((R, W), dtype=m_RW.dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=m2, data=m_t, op0=nl.multiply, operand0=b1, op1=nl.add, operand1=t_f)
    # second moment: g^2 on ScalarE, (1 - b2) g^2 + b2 v on VectorE
    sq_f = nl.ndarray((R, W), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq_f, op=nl.square, data=g_t)
    nisa.tensor_scalar(dst=sq_f, data=sq_f, op0=nl.multiply, operand0=1.0 - b2)
    v2 = nl.ndarray((R, W), dtype=v_RW.dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=v2, data=v_t, op0=nl.multiply, operand0=b2, op1=nl.add, operand1=sq_f)
    nisa.dma_copy(dst=mo_RW, src=m2)
    nisa.dma_copy(dst=vo_RW, src=v2)
    # 1 / (sqrt(v' / bc2) + eps): sqrt with the bias correction as its scale on ScalarE and SQRT_MIN as
    # its bias, so that v' = 0 stays inside sqrt's valid input range (see the module docstring)
    nisa.activation(dst=t_f, op=nl.sqrt, data=v2, scale=rbc2, bias=floor)
    nisa.tensor_scalar(dst=t_f, data=t_f, op0=nl.add, operand0=eps)
    nisa.reciprocal(dst=t_f, data=t_f)
    # u = m' / bc1 * that (+ wd p); p' = u * (-lr) + p
    nisa.scalar_tensor_tensor(dst=sq_f, data=m2, op0=nl.multiply, operand0=rbc1, op1=nl.multiply, operand1=t_f)
    if weight_decay:
        nisa.scalar_tensor_tensor(dst=sq_f, data=p_t, op0=nl.multiply, operand0=weight_decay, op1=nl.add,
                                  operand1=sq_f)
    p2 = nl.ndarray((R, W), dtype=p_RW.dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=p2, data=sq_f, op0=nl.multiply, operand0=nlr, op1=nl.add, operand1=p_t)
    nisa.dma_copy(dst=po_RW, src=p2)


@nki.jit
def adam_update(p_N, g_N, m_N, v_N, scal_P4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0):
    """(p', m', v') of a flat parameter; scal_P4 [128, 4] fp32 rows [lr, 1 - b1^t, 1 - b2^t, 0]."""
    N = p_N.shape[0]
    P = nl.tile_size.pmax
    po_N = nl.ndarray((N,), dtype=p_N.dtype, buffer=nl.shared_hbm)
    mo_N = nl.ndarray((N,), dtype=m_N.dtype, buffer=nl.shared_hbm)
    vo_N = nl.ndarray((N,), dtype=v_N.dtype, buffer=nl.shared_hbm)
    s_P4 = nl.ndarray((P, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s_P4, src=scal_P4)
    nlr_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=nlr_P1, data=s_P4[:, 0:1], op0=nl.multiply, operand0=-1.0)
    rbc1_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rbc1_P1, data=s_P4[:, 1:2])
    rbc2_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=rbc2_P1, data=s_P4[:, 2:3])
    floor_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=floor_P1, value=SQRT_MIN)
    consts = (b1, b2, eps, weight_decay)

    F = N // P
    if F > 0:
        views = [x[0:P * F].reshape((P, F)) for x in (p_N, g_N, m_N, v_N, po_N, mo_N, vo_N)]
        for _, f0, w in row_tiles(F, FREE_TILE):
            _adam_tile(*[x[:, f0:f0 + w] for x in views], nlr_P1, rbc1_P1, rbc2_P1, floor_P1, *consts)
    if P * F < N:
        tail = N - P * F
        views = [x[P * F:N].reshape((1, tail)) for x in (p_N, g_N, m_N, v_N, po_N, mo_N, vo_N)]
        _adam_tile(*views, nlr_P1[0:1], rbc1_P1[0:1], rbc2_P1[0:1], floor_P1[0:1], *consts)  # tail < 128 elements
    return po_N, mo_N, vo_N
