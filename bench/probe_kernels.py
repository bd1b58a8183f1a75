"""Probe kernels for the schedule (kernels_nki/emulator/schedule.py), written the way AWS's guides describe the
cases: the same bytes in wide or narrow DMAs (nki/deep-dives/nki-dma-bandwidth-guide.rst, "Bandwidth vs.
Payload Size"), the same VectorE instructions as a dependent chain or independent (trainium_inferentia2_arch.rst,
"Vector Engine / Performance Consideration"), a DMA-bound and a compute-bound phase that can overlap (nki_perf_guide.rst,
Opt #4), one transfer of the DMA overview's Example 1 (nki-dma-overview.rst), and a dependent tiny ScalarE chain
(nki_perf_guide.rst, Opt #5a). Run by tests/test_emulator_schedule.py, test_emulator_scheduling.py and
bench/cost_calibration.py.
"""

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def copy_in_chunks(x, chunk=4096):
    """out = x [128, F] bf16, moved HBM -> SBUF -> HBM in DMAs of `chunk` elements per partition."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    for c in range(F // chunk):
        t = nl.ndarray((P, chunk), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:P, c * chunk:(c + 1) * chunk])
        nisa.dma_copy(dst=out[0:P, c * chunk:(c + 1) * chunk], src=t)
    return out


@nki.jit
def vector_chain(x, steps=64, dependent=True):
    """`steps` VectorE tensor_scalar instructions over [128, F] fp32: each on the previous one's output
    (dependent) or each on x into its own tile (independent); the last tile stored."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    src = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    cur = src
    for i in range(steps):
        t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=t, data=cur if dependent else src, op0=nl.multiply, operand0=1.0)
        cur = t
    nisa.dma_copy(dst=out, src=cur)
    return out


@nki.jit
def load_and_compute(x, loads=32, computes=32):
    """A DMA-bound phase (`loads` [128, 2048] bf16 copies of x's first columns, stored back) and a
    compute-bound phase (`computes` independent VectorE passes over one resident tile), with no data
    between them, so the engines may overlap them; computes=0 or loads=0 runs one phase alone."""
    P, F = x.shape
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    W = 2048
    for i in range(loads):
        t = nl.ndarray((P, W), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:P, 0:W])
        nisa.dma_copy(dst=out[0:P, 0:W], src=t)
    if computes:
        src = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=src, value=1.0)
        acc = nl.ndarray((P, W), dtype=nl.float32, buffer=nl.sbuf)
        for i in range(computes):
            nisa.tensor_scalar(dst=acc, data=src, op0=nl.multiply, operand0=2.0)
        res = nl.ndarray((P, W), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[0:P, W:2 * W], src=res)
    return out


@nki.jit
def dma_example_1(a):
    """The DMA overview's Example 1: A [4, 4096] bf16 HBM -> SBUF (one DMA engine, one 32 KiB transfer),
    then back to HBM."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def scalar_tiny_chain(x, steps=64):
    """`steps` dependent ScalarE activations on one element per partition ([128, 1] fp32): the perf guide's
    Opt #5a profile."""
    P = x.shape[0]
    out = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    cur = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=cur, src=x)
    for i in range(steps):
        t = nl.ndarray((P, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=t, op=nl.copy, data=cur, scale=1.0)
        cur = t
    nisa.dma_copy(dst=out, src=cur)
    return out


@nki.jit
def stall_probe(x, order="ab", steps=8, width=2048, block=False, edge=False):
    """Two independent pieces of work on VectorE, their statements in either program order: A, one pass over
    a [128, F] fp32 tile that a DMA must load first (its VectorE instruction waits for the load); B, `steps`
    passes over a resident [128, width] tile. order="ab" writes A's VectorE instruction first (program order
    stalls VectorE behind the load), "ba" writes B's first. block=True writes both inside `nl.no_reorder()`;
    edge=True makes B's first pass depend on A's (`NkiInstruction.depends_on`). Names: "a" (A's pass),
    "b0", "b1", ... (B's passes), for `with_schedule`."""
    P, F = x.shape
    out = nl.ndarray((P, F + width), dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    b = nl.ndarray((P, width), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=b, value=1.0)
    if block:
        with nl.no_reorder():
            _stall_work(a, b, out, order, steps, edge)
    else:
        _stall_work(a, b, out, order, steps, edge)
    return out


def _stall_work(a, b, out, order, steps, edge):
    P, F = a.shape
    width = b.shape[1]
    ta = nl.ndarray((P, F), dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray((P, width), dtype=b.dtype, buffer=nl.sbuf)
    for part in order:
        if part == "a":
            ins_a = nisa.tensor_scalar(dst=ta, data=a, op0=nl.multiply, operand0=2.0, name="a")
            nisa.dma_copy(dst=out[0:P, 0:F], src=ta)
        else:
            for k in range(steps):
                ins_b = nisa.tensor_scalar(dst=tb, data=b, op0=nl.add, operand0=float(k), name=f"b{k}")
                if edge and k == 0:
                    first_b = ins_b
            nisa.dma_copy(dst=out[0:P, F:F + width], src=tb)
    if edge:
        first_b.depends_on(ins_a)
