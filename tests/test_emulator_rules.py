"""The emulator's rule table (kernels_nki/emulator/rules.py): every row has a negative test (a tiny kernel breaking
it is rejected with the rule id, its AWS source and the kernel's file:line) and a valid twin (passes and matches
NumPy); a strict row's negative form runs under reading "any" (the other reading of AWS's documents) and is
refused under reading "strict", its twin valid under both.

A case: `bad` / `good` kernel bodies (`# <-` marks the line the error must name), optional per-twin
`target`, `header`, `sig`, `args` (arguments built from the float32 input `a`), `launch` (e.g. an LNC grid),
`reading` ("strict" for the strict rows); `bad_<key>` / `good_<key>` override a key for one twin;
and `ref` (the NumPy value of the good kernel's output, from `a`). `mark_jit`: the error names the
@nki.jit line (interface rules).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import write_kernel

from kernels_nki import emulator
from kernels_nki.emulator import rules

A = np.random.default_rng(0).uniform(0.5, 2.0, (128, 64)).astype(np.float32)
PERM = np.random.default_rng(1).permutation(128).astype(np.int32).reshape(128, 1)

COPY = """
out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
t = nl.load(a)
nl.store(out, t)
return out
"""
HEAD = "out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)\nt = nl.load(a)\n"
TAIL = "nl.store(out, r)\nreturn out\n"


def unary(line: str) -> str:
    """A kernel computing r from the SBUF tile t (of a) with `line`, storing r into out."""
    return HEAD + "r = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)\n" + line + "\n" + TAIL


def via_psum(line: str) -> str:
    """p is a PSUM copy of t; `line` computes r (SBUF) from p / t."""
    return (HEAD + "p = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.psum)\n"
            "nisa.tensor_copy(dst=p, src=t)\nr = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)\n"
            + line + "\n" + TAIL)


def matmul(line: str, out_shape="(64, 64)") -> str:
    """s = a[0:128, 0:64] (bf16), m = a (bf16); `line` writes PSUM acc; r = acc."""
    return (f"out = nl.ndarray({out_shape}, dtype=nl.float32, buffer=nl.shared_hbm)\n"
            "s = nl.load(a[0:128, 0:64], dtype=nl.bfloat16)\nm = nl.load(a, dtype=nl.bfloat16)\n"
            f"acc = nl.ndarray({out_shape}, dtype=nl.float32, buffer=nl.psum)\n" + line + "\n"
            f"r = nl.ndarray({out_shape}, dtype=nl.float32, buffer=nl.sbuf)\n"
            "nisa.tensor_copy(dst=r, src=acc)\n" + TAIL)


def bf(x):
    import ml_dtypes
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


GATHER = """
out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
i = nl.load(idx)
t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
nisa.dma_copy(dst=t, src=a.ap(pattern=[[64, 128], [1, 64]], vector_offset=i){mode})  # <-
nl.store(out, t)
return out
"""

CASES = {
    # ------------------------------------------------------------------ AST pass
    "ast.is_operator": dict(bad="if a is True:  # <-\n    a = a\n" + COPY,
                            good="if a is None or None is not a:\n    a = a\n" + COPY),
    "ast.kwonly_args": dict(bad=COPY, bad_sig="a,\n      *,\n      scale=1.0,  # <-\n", good=COPY, sig="a, scale=1.0"),
    "ast.foreign_module": dict(header="import struct\nimport math", bad="n = struct.calcsize('f')  # <-\n" + COPY,
                               good="n = math.ceil(a.shape[0] / 3) * math.prod(a.shape)\n" + COPY),
    "ast.neuronxcc_namespace": dict(
        header="import neuronxcc.nki.typing as nt", sig="a: nt.tensor", bad="s = nt.tensor  # <-\n" + COPY,
        good=COPY),
    # ------------------------------------------------------------------ kernel interface
    "kernel.output_shared_hbm": dict(mark_jit=True, bad=COPY.replace("nl.shared_hbm", "nl.hbm"), good=COPY),
    "kernel.list_args": dict(mark_jit=True, sig="a, sizes", bad=COPY, bad_args=lambda a: (a, ((1, 2), [3])),
                             good=COPY, args=lambda a: (a, ((1, 2), (3,)))),
    "kernel.dict_keys": dict(bad="d = dict(x=1)\nfor i in range(2):\n    d[i] = i  # <-\n" + COPY,
                             good="d = {'x': 1, **dict(y=2)}\nd.setdefault('z', 3)\nd.update({str(i): i for i in range(2)})\n"
                             "assert sorted(d) == ['0', '1', 'x', 'y', 'z'] and isinstance(d, dict) and isinstance(dict(), dict)\n"
                             + COPY),
    "kernel.lnc": dict(mark_jit=True, bad=COPY, bad_launch=2, good=COPY, launch=1),
    "buffer.object": dict(bad=HEAD + 'r = nl.ndarray(t.shape, dtype=nl.float32, buffer="sbuf")  # <-\n' + TAIL,
                          good=unary("r = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)\n"
                                     "nisa.tensor_copy(dst=r, src=t)")),
    "tensor.zero_size": dict(bad=HEAD + "z = nl.ndarray((128, 0), dtype=nl.float32, buffer=nl.sbuf)  # <-\n"
                             "r = t\n" + TAIL, good=unary("nisa.tensor_copy(dst=r, src=t)")),
    # ------------------------------------------------------------------ memory and views
    "partition.max": dict(bad="z = nl.ndarray((129, 4), dtype=nl.float32, buffer=nl.sbuf)  # <-\n" + COPY,
                          good="z = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)\n" + COPY),
    "partition.start": dict(
        bad=HEAD + "r = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.tensor_copy(dst=r, src=t[8:24])  # <-\n" + TAIL,
        good="out = nl.ndarray((16, 64), dtype=a.dtype, buffer=nl.shared_hbm)\nt = nl.load(a)\n"
        "r = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.sbuf)\nnisa.tensor_copy(dst=r, src=t[32:48])\n" + TAIL,
        ref=lambda a: a[32:48]),
    "partition.no_stride": dict(
        bad=HEAD + "r = t[0:128:2]  # <-\n" + TAIL,
        good="out = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.shared_hbm)\nt = nl.load(a)\n"
        "r = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf)\nnisa.tensor_copy(dst=r, src=t[:, 0:64:2])\n"
        + TAIL, ref=lambda a: a[:, ::2]),
    "free.access_pattern": dict(
        bad="z = nl.ndarray((1, 70000), dtype=nl.bfloat16, buffer=nl.sbuf)\nnisa.memset(dst=z, value=0.0)  # <-\n"
        + COPY, good="z = nl.ndarray((1, 65535), dtype=nl.bfloat16, buffer=nl.sbuf)\nnisa.memset(dst=z, value=0.0)\n"
        + COPY),
    "sbuf.capacity": dict(  # direct allocation: the address must lie inside the partition (192 KiB on trn1)
        bad="b = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf, address=(0, 189 * 1024))  # <-\n" + COPY,
        good="b = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf, address=(0, 189 * 1024))\n"
        "c = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf, address=(0, 188 * 1024))\n" + COPY,
        good_target="trn2"),
    "psum.capacity": dict(
        bad="ps = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for i in range(8)]\n"
        "x = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum)  # <-\n" + COPY,
        good="ps = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for i in range(8)]\n" + COPY),
    "engine.hbm": dict(bad=unary("nisa.tensor_copy(dst=r, src=a)  # <-"), good=unary("nisa.tensor_copy(dst=r, src=t)")),
    "gpsimd.psum": dict(
        bad=HEAD + "r = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.psum)\n"
        "nisa.iota(dst=r, pattern=[[1, 64]], channel_multiplier=64)  # <-\n" + TAIL,
        good=unary("nisa.iota(dst=r, pattern=[[1, 64]], channel_multiplier=64)"),
        ref=lambda a: np.arange(a.size, dtype=np.float32).reshape(a.shape)),
    "view.reshape": dict(bad=HEAD + "r = t.reshape((64, 128))  # <-\n" + TAIL,
                         good=HEAD + "r = t.reshape((128, 8, 8))\n" + TAIL),
    "view.ap": dict(
        bad=HEAD + "r = t.ap([[32, 128], [1, 32]])  # <-\n" + TAIL,
        good="out = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.shared_hbm)\nt = nl.load(a)\n"
        "r = t.ap([[64, 128], [2, 32]])\n" + TAIL, ref=lambda a: a[:, ::2]),
    # ------------------------------------------------------------------ DMA
    "dma.buffers": dict(bad=via_psum("nisa.dma_copy(dst=out, src=p)  # <-\nr = t"),
                        good=via_psum("nisa.tensor_copy(dst=r, src=p)")),
    "dma.elements": dict(
        bad=HEAD + "r = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.dma_copy(dst=r, src=a[0:64])  # <-\n" + TAIL,
        good="out = nl.ndarray((64, 128), dtype=a.dtype, buffer=nl.shared_hbm)\n"
        "r = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)\nnisa.dma_copy(dst=r, src=a)\n" + TAIL,
        ref=lambda a: a.reshape(64, 128)),
    "dma.removed_args": dict(bad=unary("nisa.dma_copy(dst=r, src=a, dst_rmw_op=nl.add)  # <-"),
                             good=unary("nisa.dma_copy(dst=r, src=a)")),
    "dma.hwdge": dict(bad=unary("nisa.dma_copy(dst=r, src=a, dge_mode=nisa.dge_mode.hwdge)  # <-"),
                      good=unary("nisa.dma_copy(dst=r, src=a, dge_mode=nisa.dge_mode.hwdge)"), good_target="trn2"),
    "dma.hwdge_dtype": dict(
        bad_target="trn2", bad=HEAD + "r = nl.ndarray(t.shape, dtype=nl.bfloat16, buffer=nl.sbuf)\n"
        "nisa.dma_copy(dst=r, src=a, dge_mode=nisa.dge_mode.hwdge)  # <-\n" + TAIL,
        good=HEAD + "r = nl.ndarray(t.shape, dtype=nl.bfloat16, buffer=nl.sbuf)\nnisa.dma_copy(dst=r, src=a)\n" + TAIL,
        ref=bf),
    "dma.indirect": dict(sig="a, idx", args=lambda a: (a, PERM), bad=GATHER.format(mode=""),
                         good=GATHER.format(mode=""), good_target="trn2", ref=lambda a: a[PERM[:, 0]]),
    "dma.indirect_dge": dict(sig="a, idx", args=lambda a: (a, PERM), target="trn2",
                             bad=GATHER.format(mode=", dge_mode=nisa.dge_mode.none"),
                             good=GATHER.format(mode=", dge_mode=nisa.dge_mode.swdge"), ref=lambda a: a[PERM[:, 0]]),
    "dma_transpose.args": dict(
        bad=HEAD + "r = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)\n"
        "nisa.dma_transpose(dst=r, src=t)  # <-\n" + TAIL,
        good="out = nl.ndarray((64, 128), dtype=a.dtype, buffer=nl.shared_hbm)\nt = nl.load(a)\n"
        "r = nl.ndarray((64, 128), dtype=a.dtype, buffer=nl.sbuf)\nnisa.dma_transpose(dst=r, src=t, axes=(1, 0))\n"
        + TAIL, ref=lambda a: a.T),
    "dma_compute.args": dict(
        bad=unary("nisa.dma_copy(dst=r, src=a)\nnisa.dma_compute(dst=r, srcs=[r, t], reduce_op=nl.multiply)  # <-"),
        good=unary("nisa.dma_copy(dst=r, src=a)\nnisa.dma_compute(dst=r, srcs=[r, t], reduce_op=nl.add)"),
        ref=lambda a: 2 * a),
    # ------------------------------------------------------------------ TensorE
    "matmul.buffers": dict(bad=matmul("acc = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)\n"
                                      "nisa.nc_matmul(acc, s, m[:, 0:64])  # <-"),
                           good=matmul("nisa.nc_matmul(acc, s, m[:, 0:64])"), ref=lambda a: bf(a).T @ bf(a)),
    "matmul.contraction": dict(bad=matmul("nisa.nc_matmul(acc, s[0:64], m[:, 0:64])  # <-"),
                               good=matmul("nisa.nc_matmul(acc, s, m[:, 0:64])"), ref=lambda a: bf(a).T @ bf(a)),
    "matmul.stationary_fmax": dict(
        bad=matmul("w = nl.ndarray((128, 129), dtype=nl.bfloat16, buffer=nl.sbuf)\nnisa.memset(dst=w, value=0.0)\n"
                   "nisa.nc_matmul(acc, w, m[:, 0:64])  # <-"),
        good=matmul("nisa.nc_matmul(acc, s, m)"), ref=lambda a: bf(a).T @ bf(a)),
    "matmul.moving_fmax": dict(
        bad=matmul("w = nl.ndarray((128, 513), dtype=nl.bfloat16, buffer=nl.sbuf)\nnisa.memset(dst=w, value=0.0)\n"
                   "acc = nl.ndarray((64, 513), dtype=nl.float32, buffer=nl.psum)\nnisa.nc_matmul(acc, s, w)  # <-"),
        good=matmul("nisa.nc_matmul(acc, s, m)"), ref=lambda a: bf(a).T @ bf(a)),
    "matmul.dst_fp32": dict(bad=matmul("acc = nl.ndarray((64, 64), dtype=nl.bfloat16, buffer=nl.psum)\n"
                                       "nisa.nc_matmul(acc, s, m)  # <-"),
                            good=matmul("nisa.nc_matmul(acc, s, m)"), ref=lambda a: bf(a).T @ bf(a)),
    "matmul.dtypes": dict(bad=matmul("nisa.nc_matmul(acc, nl.load(a[:, 0:64]), m)  # <-"),
                          good=matmul("nisa.nc_matmul(acc, nl.load(a[:, 0:64]), nl.load(a))"),
                          ref=lambda a: a[:, :64].T @ a),
    "matmul.perf_mode": dict(bad=matmul("nisa.nc_matmul(acc, s, m, perf_mode=nisa.matmul_perf_mode.double_row)  # <-"),
                             good=matmul("nisa.nc_matmul(acc, s, m, perf_mode=nisa.matmul_perf_mode.none)"),
                             ref=lambda a: bf(a).T @ bf(a)),
    "matmul.accumulate": dict(
        bad=matmul("nisa.memset(dst=acc, value=0.0)\nnisa.nc_matmul(acc, s, m, accumulate=True)  # <-"),
        good=matmul("nisa.nc_matmul(acc, s, m, accumulate=False)\nnisa.nc_matmul(acc, s, m, accumulate=True)"),
        ref=lambda a: 2 * bf(a).T @ bf(a)),
    "matmul.tiling": dict(
        bad=matmul("nisa.nc_matmul(acc, s[0:64], m[0:64], tile_position=(32, 0), tile_size=(64, 128))  # <-"),
        good=matmul("nisa.nc_matmul(acc, s[64:128], m[64:128], tile_position=(64, 0), tile_size=(64, 128))"),
        ref=lambda a: bf(a)[64:, :64].T @ bf(a)[64:]),
    "matmul.tiling_dst": dict(  # a 64 x 64 tile at column 64 writes PSUM partitions 64..127
        bad=matmul("nisa.nc_matmul(acc, s[0:64], m[0:64], tile_position=(0, 64), tile_size=(64, 64))  # <-"),
        good="out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)\n"
        "s = nl.load(a[0:128, 0:64], dtype=nl.bfloat16)\nm = nl.load(a, dtype=nl.bfloat16)\n"
        "acc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)\n"
        "nisa.nc_matmul(acc[64:128], s[0:64], m[0:64], tile_position=(0, 64), tile_size=(64, 64))\n"
        "r = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)\nnisa.tensor_copy(dst=r, src=acc[64:128])\n" + TAIL,
        ref=lambda a: bf(a)[:64, :64].T @ bf(a)[:64]),
    "transpose.dtype": dict(
        bad=HEAD + "q = nl.load(a[0:32, 0:32], dtype=nl.bfloat16)\np = nl.ndarray((32, 32), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.nc_transpose(dst=p, data=q, engine=nisa.engine.vector)  # <-\nr = t\n" + TAIL,
        good="out = nl.ndarray((64, 64), dtype=a.dtype, buffer=nl.shared_hbm)\nq = nl.load(a[0:64])\n"
        "p = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)\nnisa.nc_transpose(dst=p, data=q)\n"
        "r = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)\nnisa.tensor_copy(dst=r, src=p)\n" + TAIL,
        ref=lambda a: a[:64].T),
    "transpose.engine": dict(
        bad=HEAD + "r = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.nc_transpose(dst=r, data=t, engine=nisa.engine.vector)  # <-\n" + TAIL,
        good="out = nl.ndarray((32, 32), dtype=a.dtype, buffer=nl.shared_hbm)\nq = nl.load(a[0:32, 0:32])\n"
        "r = nl.ndarray((32, 32), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.nc_transpose(dst=r, data=q, engine=nisa.engine.vector)\n" + TAIL, ref=lambda a: a[:32, :32].T),
    # ------------------------------------------------------------------ ScalarE / VectorE
    "tensor_copy.scalar": dict(bad=unary("nisa.tensor_copy(dst=r, src=t, engine=nisa.engine.scalar)  # <-"),
                               good=unary("nisa.activation(dst=r, op=nl.copy, data=t)")),
    "activation.op_table": dict(bad=unary("nisa.activation(dst=r, op=nl.negative, data=t)  # <-"),
                                good=unary("nisa.activation(dst=r, op=nl.exp, data=t)"), ref=np.exp),
    "activation.bias_vector": dict(
        bad=unary("nisa.activation(dst=r, op=nl.exp, data=t, bias=1.0)  # <-"),
        good=unary("b = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\nnisa.memset(dst=b, value=1.0)\n"
                   "nisa.activation(dst=r, op=nl.exp, data=t, bias=b)"), ref=lambda a: np.exp(a + 1)),
    "activation.reciprocal_bias": dict(
        bad=unary("b = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\nnisa.memset(dst=b, value=1.0)\n"
                  "nisa.activation(dst=r, op=nl.reciprocal, data=t, bias=b)  # <-"),
        good=unary("b = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\nnisa.memset(dst=b, value=1.0)\n"
                   "nisa.activation(dst=r, op=nl.reciprocal, data=t, bias=b)"), good_target="trn2",
        ref=lambda a: 1 / (a + 1)),
    "activation.reduce_add": dict(
        bad=unary("s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\n"
                  "nisa.activation_reduce(dst=r, op=nl.copy, data=t, reduce_op=nl.maximum, reduce_res=s)  # <-"),
        good="out = nl.ndarray((128, 1), dtype=a.dtype, buffer=nl.shared_hbm)\nt = nl.load(a)\n"
        "y = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)\n"
        "r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.activation_reduce(dst=y, op=nl.copy, data=t, reduce_op=nl.add, reduce_res=r)\n" + TAIL,
        ref=lambda a: a.sum(axis=1, keepdims=True)),
    "activation.operands": dict(
        bad=unary("c = nl.load(a[:, 0:1], dtype=nl.bfloat16)\nnisa.activation(dst=r, op=nl.copy, data=t, scale=c)  # <-"),
        good=unary("c = nl.load(a[:, 0:1])\nnisa.activation(dst=r, op=nl.copy, data=t, scale=c)"),
        ref=lambda a: a * a[:, :1]),
    "activation.input_range": dict(
        bad=unary("z = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)\nnisa.memset(dst=z, value=0.0)\n"
                  "nisa.activation(dst=r, op=nl.sqrt, data=z)  # <-"),
        good=unary("nisa.activation(dst=r, op=nl.sqrt, data=t)"), ref=np.sqrt),
    "alu.op_table": dict(bad=unary("nisa.tensor_tensor(dst=r, data1=t, data2=t, op=nl.divide)  # <-"),
                         good=unary("nisa.tensor_tensor(dst=r, data1=t, data2=t, op=nl.multiply)"),
                         ref=lambda a: a * a),
    "alu.no_broadcast": dict(bad=HEAD + "r = nl.add(t, t[:, 0:1])  # <-\n" + TAIL,
                             good=unary("nisa.tensor_scalar(dst=r, data=t, op0=nl.add, operand0=t[:, 0:1])"),
                             ref=lambda a: a + a[:, :1]),
    "tensor_scalar.operands": dict(
        bad=unary("c = nl.load(a[:, 0:1], dtype=nl.bfloat16)\n"
                  "nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=c)  # <-"),
        good=unary("nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=t[:, 0:1], op1=nl.add, operand1=2)"),
        ref=lambda a: a * a[:, :1] + 2),
    "tensor_scalar.gpsimd": dict(
        bad=unary("nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=2.0, engine=nisa.engine.gpsimd)  # <-"),
        good=unary("nisa.tensor_scalar(dst=r, data=t, op0=nl.rsqrt, operand0=0.0, engine=nisa.engine.gpsimd)"),
        ref=lambda a: 1.0 / np.sqrt(a)),
    "tensor_tensor.psum": dict(bad=via_psum("nisa.tensor_tensor(dst=r, data1=p, data2=p, op=nl.add)  # <-"),
                               good=via_psum("nisa.tensor_tensor(dst=r, data1=p, data2=t, op=nl.add)"),
                               ref=lambda a: 2 * a),
    "stt.psum": dict(
        bad=via_psum("nisa.scalar_tensor_tensor(dst=r, data=p, op0=nl.multiply, operand0=2.0, op1=nl.add, "
                     "operand1=p)  # <-"),
        good=via_psum("nisa.scalar_tensor_tensor(dst=r, data=p, op0=nl.multiply, operand0=2.0, op1=nl.add, "
                      "operand1=t)"), ref=lambda a: 3 * a),
    "scan.psum": dict(
        bad=via_psum("nisa.tensor_tensor_scan(dst=r, data0=p, data1=p, initial=0.0, op0=nl.multiply, "
                     "op1=nl.add)  # <-"),
        good=via_psum("o = nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf)\nnisa.memset(dst=o, value=1.0)\n"
                      "nisa.tensor_tensor_scan(dst=r, data0=o, data1=p, initial=0.0, op0=nl.multiply, op1=nl.add)"),
        ref=lambda a: np.cumsum(a, axis=1)),
    "reduce.axes": dict(
        bad=HEAD + "r = nl.ndarray((1, 64), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=0)  # <-\n" + TAIL,
        good="out = nl.ndarray((128, 1), dtype=a.dtype, buffer=nl.shared_hbm)\nt = nl.load(a)\n"
        "r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.tensor_reduce(dst=r, op=nl.add, data=t, axis=1)\n" + TAIL, ref=lambda a: a.sum(1, keepdims=True)),
    "reduce.op": dict(
        bad=HEAD + "r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.tensor_reduce(dst=r, op=nl.equal, data=t, axis=1)  # <-\n" + TAIL,
        good="out = nl.ndarray((128, 1), dtype=a.dtype, buffer=nl.shared_hbm)\nt = nl.load(a)\n"
        "r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.tensor_reduce(dst=r, op=nl.maximum, data=t, axis=1)\n" + TAIL, ref=lambda a: a.max(1, keepdims=True)),
    "memset.value": dict(
        bad=unary("i = nl.ndarray(t.shape, dtype=nl.int32, buffer=nl.sbuf)\nnisa.memset(dst=i, value=2.5)  # <-"),
        good=unary("i = nl.ndarray(t.shape, dtype=nl.int32, buffer=nl.sbuf)\nnisa.memset(dst=i, value=2)\n"
                   "nisa.tensor_copy(dst=r, src=i)"), ref=lambda a: np.full_like(a, 2)),
    "gather.args": dict(  # nc_n_gather: column j of each partition gathers element 63 - j (uint32 indices)
        bad=unary("i = nl.ndarray((128, 64), dtype=nl.int32, buffer=nl.sbuf)\n"
                  "nisa.iota(dst=i, pattern=[[-1, 64]], offset=63)\nnisa.nc_n_gather(dst=r, data=t, indices=i)  # <-"),
        good=unary("i = nl.ndarray((128, 64), dtype=nl.uint32, buffer=nl.sbuf)\n"
                   "nisa.iota(dst=i, pattern=[[-1, 64]], offset=63)\nnisa.nc_n_gather(dst=r, data=t, indices=i)"),
        ref=lambda a: a[:, ::-1]),
    "affine_select.args": dict(
        bad=via_psum("nisa.affine_select(dst=r, pattern=[[-1, 64]], channel_multiplier=1, on_true_tile=p, "
                     "on_false_value=0.0, cmp_op=nl.greater_equal)  # <-"),
        good=unary("nisa.affine_select(r, [[-1, 64]], 1, t, -5.0, cmp_op=nl.greater_equal)"),
        ref=lambda a: np.where(np.arange(128)[:, None] >= np.arange(64)[None, :], a, -5.0)),
    # ------------------------------------------------------------------ the strict reading
    "strict.transpose_dtype": dict(  # bf16 data: nc_transpose refused; a matmul against the identity into fp32
        reading="strict",
        bad=HEAD + "q = nl.load(a[0:64], dtype=nl.bfloat16)\np = nl.ndarray((64, 64), dtype=nl.bfloat16, buffer=nl.psum)\n"
        "nisa.nc_transpose(dst=p, data=q)  # <-\nr = t\n" + TAIL,
        good="out = nl.ndarray((64, 64), dtype=a.dtype, buffer=nl.shared_hbm)\nq = nl.load(a[0:64], dtype=nl.bfloat16)\n"
        "eye = nl.shared_identity_matrix(64, dtype=nl.bfloat16)\n"
        "p = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)\nnisa.nc_matmul(p, q, eye, is_transpose=True)\n"
        "r = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)\nnisa.activation(dst=r, op=nl.copy, data=p)\n"
        + TAIL, ref=lambda a: bf(a[:64]).T),
    "strict.accumulate_inference": dict(  # two accumulation groups in one bank: inferred, then explicit
        reading="strict",
        bad=matmul("nisa.nc_matmul(acc[:, 0:32], s, m[:, 0:32])\nnisa.nc_matmul(acc[:, 32:64], s, m[:, 32:64])  # <-"),
        good=matmul("nisa.nc_matmul(acc[:, 0:32], s, m[:, 0:32], accumulate=False)\n"
                    "nisa.nc_matmul(acc[:, 32:64], s, m[:, 32:64], accumulate=False)"),
        ref=lambda a: bf(a).T @ bf(a)),
    "strict.row_tile_partitions": dict(  # the bottom row tile multiplies partitions 64..127
        reading="strict",
        bad=matmul("nisa.nc_matmul(acc, s[0:64], m[0:64], tile_position=(64, 0), tile_size=(64, 128))  # <-"),
        good=matmul("nisa.nc_matmul(acc, s[64:128], m[64:128], tile_position=(64, 0), tile_size=(64, 128))"),
        ref=lambda a: bf(a)[64:, :64].T @ bf(a)[64:]),
    "strict.is_none": dict(reading="strict", bad="if a is not None:  # <-\n    a = a\n" + COPY,
                           good="if a != None:  # noqa: E711\n    a = a\n" + COPY),
    "strict.loop_alias": dict(reading="strict", bad="for i in nl.affine_range(2):  # <-\n    a = a\n" + COPY,
                              good="for i in range(2):\n    a = a\n" + COPY),
}
STRICT = sorted(r.id for r in rules.RULES if r.strict)


def _build(tmp_path, monkeypatch, case: dict, which: str):
    get = lambda key, default=None: case.get(f"{which}_{key}", case.get(key, default))  # noqa: E731
    name, where = write_kernel(tmp_path, monkeypatch, case[which], header=get("header", ""), sig=get("sig", "a"),
                               mark_jit=case.get("mark_jit", False))
    args = get("args", lambda a: (a,))(A)
    return name, where, args, get("target", "trn1"), get("launch", 1), get("reading", "any")


def _run(name, args, target, launch, reading="any"):
    k = emulator.load_kernel_module(name).k
    return emulator.run(k[launch] if launch != 1 else k, *args, target=target, reading=reading)[0]


def test_every_rule_has_a_negative_case_and_a_valid_twin():
    assert set(CASES) == set(rules.RULES_BY_ID), (set(rules.RULES_BY_ID) ^ set(CASES))
    for rule in rules.RULES:
        assert rule.targets and set(rule.targets) <= set(rules.TARGETS) and rule.source.strip(), rule.id
        assert rule.kind in ("runtime", "ast"), rule.id
        # a strict row is checked under reading "strict" only, and says how the documents disagree
        assert rule.strict == rule.id.startswith("strict.") == (CASES[rule.id].get("reading") == "strict"), rule.id
        assert not rule.strict or (rule.reading and rule.source.count("'") >= 4), rule.id


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_violation_is_rejected_naming_rule_source_and_line(tmp_path, monkeypatch, rule_id):
    name, where, args, target, launch, reading = _build(tmp_path, monkeypatch, CASES[rule_id], "bad")
    with pytest.raises(emulator.NkiRuleError) as info:
        _run(name, args, target, launch, reading)
    err = info.value
    assert err.rule.id == rule_id, str(err)
    assert str(err).startswith(f"{where}: [{rule_id}]"), str(err)
    assert err.rule.source in str(err)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_valid_twin_passes_and_matches_numpy(tmp_path, monkeypatch, rule_id):
    case = CASES[rule_id]
    name, _, args, target, launch, reading = _build(tmp_path, monkeypatch, case, "good")
    out = _run(name, args, target, launch, reading)
    ref = case.get("ref", lambda a: a)(A.astype(np.float64))
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("rule_id", STRICT)
def test_strict_forms_run_under_the_reading_any(tmp_path, monkeypatch, rule_id):
    """A strict row's negative form is valid under one documented reading: reading "any" (the default, AWS's
    kernels run under it) accepts it."""
    name, _, args, target, launch, _ = _build(tmp_path, monkeypatch, CASES[rule_id], "bad")
    out = _run(name, args, target, launch, "any")
    assert np.asarray(out).shape
    with pytest.raises(emulator.NkiRuleError, match=rf"\[{rule_id}\]"):
        _run(name, args, target, launch, "strict")
    rules.violate(rule_id, "probe", "trn1")  # reading "any": returns


def test_strict_transposes_on_trn1(tmp_path, monkeypatch):
    """On NeuronCore-v2 a TensorE nc_transpose of bf16 data is valid under one reading whatever its PSUM dtype (bf16
    by nc_transpose's text, fp32 by the matmul's): both refused; fp32 data into fp32 PSUM is valid under both;
    on trn2 (transpose mode, bf16 PSUM output documented) the rule does not apply."""
    body = ("out = nl.ndarray((64, 64), dtype=a.dtype, buffer=nl.shared_hbm)\nq = nl.load(a[0:64], dtype={dt})\n"
            "p = nl.ndarray((64, 64), dtype={ps}, buffer=nl.psum)\nnisa.nc_transpose(dst=p, data=q)  # <-\n"
            "r = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)\nnisa.activation(dst=r, op=nl.copy, data=p)\n"
            + TAIL)
    for dt, ps in (("nl.bfloat16", "nl.bfloat16"), ("nl.bfloat16", "nl.float32"), ("nl.float32", "nl.float32")):
        name, where = write_kernel(tmp_path, monkeypatch, body.format(dt=dt, ps=ps))
        k = emulator.load_kernel_module(name).k
        want = bf(A[:64]).T if dt == "nl.bfloat16" else A[:64].T
        np.testing.assert_allclose(emulator.run(k, A)[0], want, rtol=1e-6)
        np.testing.assert_allclose(emulator.run(k, A, target="trn2", reading="strict")[0], want, rtol=1e-6)
        if dt == "nl.float32":
            np.testing.assert_allclose(emulator.run(k, A, reading="strict")[0], want, rtol=1e-6)
            continue
        with pytest.raises(emulator.NkiRuleError, match=r"\[strict.transpose_dtype\]") as info:
            emulator.run(k, A, reading="strict")
        assert str(info.value).startswith(where)


ACC = """
out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
s = nl.load(a, dtype=nl.bfloat16)
m = s
acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
other = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
{lines}
r = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
nisa.tensor_copy(dst=r, src=acc[0:64, 0:64])
nl.store(out, r)
return out
"""


@pytest.mark.parametrize("lines,ok", [
    # one group accumulating over the contraction by inference: valid
    ("for i in range(2):\n    nisa.nc_matmul(acc[0:64, 0:64], s[64 * i:64 * i + 64], m[64 * i:64 * i + 64])", True),
    # a second group in another tile (another bank) by inference: valid
    ("nisa.nc_matmul(acc[0:64, 0:64], s, m)\nnisa.nc_matmul(other, s, m)", True),
    # a second group beside the first in its bank by inference: overwrites per location, accumulates per bank
    ("nisa.nc_matmul(acc[0:64, 0:32], s, m[:, 0:32])\nnisa.nc_matmul(acc[0:64, 32:64], s, m[:, 32:64])", False),
    # a write covering written and unwritten locations of the group: half of it overwrites per location
    ("nisa.nc_matmul(acc[0:64, 0:32], s, m[:, 0:32])\nnisa.nc_matmul(acc[0:64, 0:64], s, m)", False),
    # other partitions (the column tile at 64) hold their own banks: valid
    ("nisa.nc_matmul(acc[0:64, 0:64], s, m, tile_position=(0, 0), tile_size=(128, 64))\n"
     "nisa.nc_matmul(acc[64:128, 0:64], s, m, tile_position=(0, 64), tile_size=(128, 64))", True),
    # explicit flags: as many groups in a bank as the kernel opens
    ("nisa.nc_matmul(acc[0:64, 0:32], s, m[:, 0:32], accumulate=False)\n"
     "nisa.nc_matmul(acc[0:64, 32:64], s, m[:, 32:64], accumulate=False)\n"
     "nisa.nc_matmul(acc[0:64, 32:64], s, m[:, 32:64], accumulate=True)", True),
])
def test_strict_accumulate_inference_per_bank_and_partition(tmp_path, monkeypatch, lines, ok):
    """Inference reads the same per bank (of one partition: '8 PSUM banks per partition') and per location while
    each partition's bank holds one accumulation group, in count-only mode too (the step estimate's)."""
    name, _ = write_kernel(tmp_path, monkeypatch, ACC.format(lines=lines))
    k = emulator.load_kernel_module(name).k
    emulator.run(k, A)  # reading "any": every case runs
    for run in (lambda: emulator.run(k, A, reading="strict"),
                lambda: emulator.count(k, (A.shape, "float32"), reading="strict")):
        if ok:
            run()
        else:
            with pytest.raises(emulator.NkiRuleError, match=r"\[strict.accumulate_inference\]"):
                run()


def test_target_only_rules_are_skipped_on_other_targets():
    """A trn1-only rule (NeuronCore-v2 limits) never fires on trn2."""
    v2_only = [r for r in rules.RULES if r.targets == ("trn1",)]
    assert {r.id for r in v2_only} >= {"tensor_copy.scalar", "activation.bias_vector", "dma.indirect", "dma.hwdge"}
    for r in v2_only:
        rules.violate(r.id, "probe", "trn2", reading="strict")  # returns without raising
        with pytest.raises(emulator.NkiRuleError):
            rules.violate(r.id, "probe", "trn1", reading="strict")


def test_rule_listing_cli(capsys):
    assert rules.main(["--target", "trn2", "--markdown"]) == 0
    text = capsys.readouterr().out
    assert "`dma.indirect`" not in text and "`tensor_copy.scalar`" not in text and "`partition.start`" in text


def test_the_package_command_line_lists_the_table_without_warnings_in_100_columns():
    """`python -m kernels_nki.emulator` (rules.py is imported by the package: run with -m it drew runpy's
    RuntimeWarning) prints the plain table wrapped to 100 columns."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "kernels_nki.emulator"], cwd=repo, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stderr == ""
    lines = res.stdout.splitlines()
    assert len(lines) > len(rules.RULES) and max(map(len, lines)) <= rules.TABLE_WIDTH
    assert all(any(line.startswith(f"{r.id} ") for line in lines) for r in rules.RULES)


def test_docs_rule_table_is_the_modules():
    """docs/kernels/emulator-rules.md carries `python -m kernels_nki.emulator --markdown` verbatim."""
    page = Path(__file__).resolve().parents[1] / "docs" / "kernels" / "emulator-rules.md"
    assert rules.table(markdown=True) in page.read_text(), "rerun python -m kernels_nki.emulator --markdown"


def test_list_default_is_rejected_at_the_parameter(tmp_path, monkeypatch):
    """A list default is a list argument the caller never passes: the AST pass names the parameter's line."""
    name, where = write_kernel(tmp_path, monkeypatch, COPY, sig="a,\n      sizes=[1, 2],  # <-\n")
    with pytest.raises(emulator.NkiRuleError, match=r"\[kernel.list_args\].*sizes") as info:
        emulator.load_kernel_module(name)
    assert str(info.value).startswith(where)
    name, _ = write_kernel(tmp_path, monkeypatch, COPY, sig="a,\n      sizes=(1, 2),\n")
    np.testing.assert_array_equal(emulator.run(emulator.load_kernel_module(name).k, A)[0], A)


def test_literal_non_string_dict_key_is_rejected_before_the_kernel_runs(tmp_path, monkeypatch):
    name, where = write_kernel(tmp_path, monkeypatch, "d = {'a': 1,\n     2: 3}  # <-\n" + COPY)
    with pytest.raises(emulator.NkiRuleError, match=r"\[kernel.dict_keys\]") as info:
        emulator.load_kernel_module(name)
    assert str(info.value).startswith(where)


def test_nki_changes_since_0_3_are_listed_with_where_the_emulator_follows_them(capsys):
    """Every NKI 0.4-0.6 difference row names its release and section; a rule it cites exists."""
    assert rules.NKI_VERSION == "0.6.0"
    assert {c.version for c in rules.CHANGES} == {"0.4.0", "0.5.0", "0.6.0"}
    for c in rules.CHANGES:
        assert "(" in c.what and c.emulator, c
        if c.emulator.startswith("rule "):
            assert c.emulator.split()[1] in rules.RULES_BY_ID, c
    assert rules.main(["--changes"]) == 0
    assert capsys.readouterr().out.count("NKI 0.") == len(rules.CHANGES)
