"""The attention backward (kernels_nki/attention/kernels.py holds the @nki.jit entry points): the work of one call
as jobs, one per (sequence, kv head), each in three parts: its set-up (the sequence's loads and -Di / -lse columns
for its first kv head; the kv head's k / v rows and transposes, its query heads' q / dO rows and transposes and
per-tile views: `_setup`), its (query tile, key chunk) steps (`bwd_heads`, whose dk / dv PSUM accumulators leave
PSUM right after them) and its tail (dq / dk through the rotation and the norm, the gain's gradient and, for a
sequence's last kv head, the stores of its gradients from their natural rows: `_tail`). Job n's steps carry job
n - 1's tail and job n + 1's set-up as side work (docs/kernels/attention.md, "Instruction order"); a sequence's
tiles come in two sets used in turn (`_seq_tiles`).
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.attention.layout import block, natural_cols, neg_lse_load, neg_rowdot, rows_from_transpose, \
    seq_dma, seq_tile
from kernels_nki.attention.rope_norm import gain_column, gain_tile, prep_grad, rope_tiles
from kernels_nki.attention.rows import causal_bias, dims, kv_head
from kernels_nki.attention.state import KvAcc
from kernels_nki.attention.steps import KC, bwd_heads, bwd_tile, gain_grad, run_stages, store_kv_grad
from kernels_nki.attention.xsa import xsa_units
from kernels_nki.tiles import HALF, cdiv, identity, pipeline, row_tiles, stacked_transpose, transpose


def bwd(q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK, rope, xc_BHT1=None):
    """The backward of both kernels.

    Args:
        rope: () or a `Rope` with the forward's residuals (`saved`).
        xc_BHT1: with XSA, the forward's o . u per row (o, do are then XSA's output and its cotangent:
            `_xsa_units`), else None.

    Returns:
        (dq, dk, dv) and, with rope, dg_BH1.

    Notes:
        One job per (sequence, kv head):

            pipeline(jobs, [(0, setup),   # job n's set-up: now (n = 0), or a side unit of job n - 1's steps
                            (1, steps)])  # job n's steps, side = job n - 1's tail + job n + 1's set-up;
                                          # its tail the side work of the next
    """
    B, T, H, K, G, R, P, dt, scale = dims(q_BTHK, k_BTGK)
    outs = {"dq": nl.ndarray((B, T, H, K), dtype=dt, buffer=nl.shared_hbm),
            "dk": nl.ndarray((B, T, G, K), dtype=dt, buffer=nl.shared_hbm),
            "dv": nl.ndarray((B, T, G, K), dtype=dt, buffer=nl.shared_hbm)}
    dg_BH1 = nl.ndarray((B, H, 1), dtype=nl.float32, buffer=nl.shared_hbm) if rope else None
    c = {"bias": causal_bias(dt), "ident32": identity(nl.float32), "dims": (B, T, H, K, G, R, P, dt, scale),
         "tables": rope_tiles(rope.cos, rope.sin) if rope else (), "rope": rope, "outs": outs, "dg": dg_BH1,
         "ins": (q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK), "xc": xc_BHT1}
    g_sb = gain_tile(rope.gain) if rope else None
    c["gains"] = [gain_column(g_sb, h, K) if rope else () for h in range(H)]
    slots = [_seq_tiles(c) for _ in range(min(B, 2))]  # a sequence's tiles, two sets used in turn
    seqs = [dict(slots[b % 2]) for b in range(B)]
    jobs = [(b, g) for b in range(B) for g in range(G)]
    set_up = []  # the jobs set up and not yet run, oldest first
    side = {"units": []}  # the next job's side work: the last job's tail, then the next job's set-up

    def setup(n):
        js = {}
        set_up.append(js)
        if n == 0:
            loads, units = _setup(c, seqs, jobs[n], js)
            run_stages(loads + units)
            return
        units_now = side["units"]

        def unit():  # after the previous tail: its tiles released before these
            loads, units = _setup(c, seqs, jobs[n], js)
            units_now.extend(loads + units)
        units_now.append(unit)

    def steps(n):
        js = set_up.pop(0)
        res = _steps(c, js, side["units"])
        side["units"] = _tail(c, seqs, js, res)  # its dk / dv accumulators released before the next job's

    pipeline(len(jobs), [(0, setup), (1, steps)])
    run_stages(side["units"])
    grads = (outs["dq"], outs["dk"], outs["dv"])
    if rope:
        return grads + (dg_BH1,)
    return grads


def _seq_tiles(c):
    """One set of a sequence's SBUF tiles: q, o; dO (its rows made from dO^T), k, v (only v^T is read); the
    gradients in natural rows (stored so); qg / kr (the rows of
    the saved transposes, loaded anyway, transposed back on chip) and their inverse RMS."""
    B, T, H, K, G, R, P, dt, scale = c["dims"]
    q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK = c["ins"]
    rope = c["rope"]
    st = {"q": seq_tile(q_BTHK, dt), "o": seq_tile(o_BTHK, dt), "do": seq_tile(do_BTHK, dt),
          "do_nat": seq_tile(do_BTHK, dt), "k": seq_tile(k_BTGK, dt), "v": seq_tile(v_BTGK, dt),
          "grads": {name: seq_tile(x, dt) for name, x in c["outs"].items()},
          "negl": nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf),  # -lse, -Di columns
          "negdi": nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf)}
    if rope:
        saved = rope.saved
        st["qg"], st["qinv"] = seq_tile(saved.qg, dt), seq_tile(saved.qinv, nl.float32)
        st["kr"], st["kinv"] = seq_tile(saved.kr, dt), seq_tile(saved.kinv, nl.float32)
    # -xc in the `perm` layout's columns
    if c["xc"] != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        st["negc"] = nl.ndarray((P, cdiv(T, P) * H), dtype=nl.float32, buffer=nl.sbuf)
    return st


def _seq_units(c, st, b):
    """(DMA units, compute units): sequence b's loads into st (a `_seq_tiles` set), its -Di and -lse columns."""
    B, T, H, K, G, R, P, dt, scale = c["dims"]
    q_BTHK, k_BTGK, v_BTGK, o_BTHK, lse_BHT1, do_BTHK = c["ins"]
    rope = c["rope"]
    loaded = [("q", q_BTHK, False), ("o", o_BTHK, True), ("do", do_BTHK, True), ("k", k_BTGK, False),
              ("v", v_BTGK, True)]
    if rope:
        st["dg"] = nl.ndarray((1, H), dtype=nl.float32, buffer=nl.sbuf)
        loaded += [("qinv", rope.saved.qinv, False), ("kinv", rope.saved.kinv, False)]

    def loads():
        for name, x, perm in loaded:
            seq_dma(st[name], x, b, True, perm)

    lse_HT = nl.ndarray((H, T), dtype=nl.float32, buffer=nl.sbuf)

    def lse():
        neg_lse_load(lse_BHT1, b, c["ident32"], lse_HT, st["negl"])

    units = [lse]
    # -Di = -rowsum(dO o) (with XSA, -rowsum(dy y): the same, `_xsa_units`), before dO becomes XSA's da in place
    units += neg_rowdot(st["do"], st["o"], H, T, c["ident32"], st["negdi"])
    dmas = [lambda: nisa.dma_copy(dst=lse_HT, src=lse_BHT1[b].reshape((H, T)))]
    if c["xc"] != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        xc_HT = nl.ndarray((H, T), dtype=nl.float32, buffer=nl.sbuf)
        dmas.append(lambda: nisa.dma_copy(dst=xc_HT, src=c["xc"][b].reshape((H, T))))
        units.append(lambda: neg_lse_load(c["xc"], b, c["ident32"], xc_HT, st["negc"], perm=True))
    return [loads], dmas + units


def _setup(c, seqs, bg, js):
    """(DMA units, compute units) filling js, the state of job bg = (sequence, kv head)."""
    B, T, H, K, G, R, P, dt, scale = c["dims"]
    b, g = bg
    rope, bias = c["rope"], c["bias"]
    st = seqs[b]
    js.update({"b": b, "g": g, "tiles": [None] * R})
    units, loads = _seq_units(c, st, b) if g == 0 else ([], [])
    units = units + loads  # the sequence's loads after the tail still reading the same set of tiles
    loads = []
    krT = nl.ndarray((K, T), dtype=dt, buffer=nl.sbuf)
    qTs = [nl.ndarray((K, T), dtype=dt, buffer=nl.sbuf) for _ in range(R)]
    # query heads in pairs (K = 64): their dO^T stacked on the two halves of the partitions, one PSUM copy per
    # tile for both (`stacked_transpose`), v^T on both halves (kv_head's `dup`)
    stack = R > 1 and K == HALF
    paired = [stack and r - r % 2 + 1 < R for r in range(R)]  # head r shares a [2 K, T] tile with its partner
    pair_tiles = [nl.ndarray((2 * K, T), dtype=dt, buffer=nl.sbuf) if paired[r] else None for r in range(0, R, 2)]
    doTs = [pair_tiles[r // 2][(r % 2) * K:(r % 2 + 1) * K] if paired[r] else
            nl.ndarray((K, T), dtype=dt, buffer=nl.sbuf) for r in range(R)]
    if rope:  # the saved transposes: one DMA per (sequence, head)
        loads.append(lambda: nisa.dma_copy(dst=krT, src=rope.saved.krT[b, g]))
        for r in range(R):
            loads.append(lambda r=r: nisa.dma_copy(dst=qTs[r], src=rope.saved.qgT[b, g * R + r]))

    def kside():
        saved = ()
        if rope:
            rows_from_transpose(st["kr"], G, g, krT, T, bias.ident)
            saved = (st["kr"], st["kinv"], krT)
        js["k_tiles"], js["kT"], js["k_norms"] = kv_head(st["k"], G, g, T, dt, bias.ident, saved=saved)
        _, vT, _ = kv_head(st["v"], G, g, T, dt, bias.ident, perm=True, dup=stack)
        js["vTs"] = [vT[(r % 2) * K:(r % 2 + 1) * K] if stack else vT for r in range(R)]
        js["halves"] = [r % 2 for r in range(R)] if stack else None  # dp's row tile: its operands' half

    def dots(r):  # dO^T of head r (even with `stack`), and of r + 1 stacked beside it
        h = g * R + r
        for i, _, rows in row_tiles(T):
            if paired[r]:
                stacked_transpose(natural_cols(pair_tiles[r // 2], i, T, True),
                                  [block(st["do"], i, h + s, H, K) for s in range(2)], rows, bias.ident)
            else:
                transpose(natural_cols(doTs[r], i, T, True), block(st["do"], i, h, H, K)[0:rows], rows, K,
                          bias.ident)

    def head(r):
        h = g * R + r
        qT_h = ()
        if rope:
            qT_h = qTs[r]
            rows_from_transpose(st["qg"], H, h, qT_h, T, bias.ident)
        doT_h = doTs[r]
        rows_from_transpose(st["do_nat"], H, h, doT_h, T, bias.ident, p0=(r % 2) * K if paired[r] else 0)
        row = []
        for i, t0, rows in row_tiles(T):
            dO = (block(st["do_nat"], i, h, H, K), doT_h[0:K, t0:t0 + rows])
            views = (block(st["q"], i, h, H, K), dO, block(st["negdi"], i, h, H, 1), block(st["negl"], i, h, H, 1),
                     block(st["grads"]["dq"], i, h, H, K))
            qk = ((c["tables"][i], c["gains"][h], (block(st["qg"], i, h, H, K), block(st["qinv"], i, h, H, 1),
                                                   qT_h[0:K, t0:t0 + rows])) if rope else ())
            row.append(bwd_tile(views, t0, rows, bias, dt, qk))
        js["tiles"][r] = row

    units.append(kside)
    if c["xc"] != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        units.extend(_xsa_units(c, st, js, g))
    for r in range(R):
        if r % 2 == 0 or not stack:
            units.append(lambda r=r: dots(r))
        units.append(lambda r=r: head(r))
    return loads, units


def _steps(c, js, side):
    """Job js's steps with `side` units beside them; its dk / dv out of PSUM -> (dq items, dk items)."""
    B, T, H, K, G, R, P, dt, scale = c["dims"]
    banks = cdiv(cdiv(T, P), KC // K)  # PSUM banks per accumulator: KC // K key tiles per bank
    acc = KvAcc(dk=[nl.ndarray((P, KC), dtype=nl.float32, buffer=nl.psum) for _ in range(banks)],
                dv=[nl.ndarray((P, KC), dtype=nl.float32, buffer=nl.psum) for _ in range(banks)])
    items = bwd_heads(js["tiles"], js["kT"], js["vTs"], js["k_tiles"], acc, c["bias"], scale, dt, c["rope"], side,
                      js["halves"])
    return items, acc


def _tail(c, seqs, js, res):
    """Units of job js's tail: dq / dk through the rotation and the norm, dg, the stores."""
    B, T, H, K, G, R, P, dt, scale = c["dims"]
    b, g = js["b"], js["g"]
    st, rope = seqs[b], c["rope"]
    items, acc = res
    grads = st["grads"]
    dk_items = store_kv_grad(grads["dk"], G, acc.dk, g, T, K, scale, dt, c["tables"], js["k_norms"])
    # XSA's share of dv, transposed back into its PSUM accumulator
    if c["xc"] != None:  # noqa: E711 (NKI 0.3 has no `is`: nki/migration/index.rst)
        per_bank = KC // K
        for kt, k0, kr in row_tiles(T):
            col = (kt % per_bank) * K
            nisa.nc_matmul(dst=acc.dv[kt // per_bank][0:kr, col:col + K],
                           stationary=js["dvxT"][0:K, k0:k0 + kr], moving=c["bias"].ident[0:K, 0:K],
                           is_transpose=True, accumulate=True)
    store_kv_grad(grads["dv"], G, acc.dv, g, T, K, 1.0, dt)
    chains = []  # independent chains of units, interleaved below (a chain's consecutive units depend)
    for r in range(R):
        h = g * R + r
        units = []
        if rope:
            dg_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
            units.append(lambda dg_P1=dg_P1: nisa.memset(dst=dg_P1, value=0.0, engine=nisa.engine.gpsimd))
            units.extend(prep_grad(items[r], nisa.engine.gpsimd, dg_P1,
                                   lambda dg_P1=dg_P1, h=h: gain_grad(st["dg"], dg_P1, h, K)))
        chains.append(units)
    units = []
    if dk_items:
        units.extend(prep_grad(dk_items, nisa.engine.gpsimd))
    chains.append(units)
    units = [u for k in range(max(len(ch) for ch in chains)) for ch in chains if k < len(ch) for u in ch[k:k + 1]]
    if g == G - 1:
        def stores():
            for name in ("dq", "dk", "dv"):
                seq_dma(grads[name], c["outs"][name], b, False)
            if rope:
                nisa.dma_copy(dst=c["dg"][b].reshape((1, H)), src=st["dg"])
            st.clear()  # the sequence's tiles released
        units.append(stores)
    return units


def _xsa_units(c, st, js, g):
    """XSA's backward for kv head g of a sequence as side-work units (st: its `_seq_tiles`, the `perm` layout; o is
    XSA's output y, dO its cotangent dy, negc -c, c = a . u the forward's o . u before XSA): per query head of the
    group, -(dy . u) per row (GpSimd products, one VectorE row sum for every full block), da = dy - (dy . u) u in
    place of dO (VectorE), so that the dO rows and transposes made after these units see da; dv's XSA share -(sum
    over the group's heads of c da + (dy . u) y) / max(||v||, 1e-12) (reference.xsa_bwd: (I - u u^T) / ||v||
    applied to du, y and da being orthogonal to u), rounded to dt and transposed into natural columns js["dvxT"]
    ([K, T]), which `_tail` transposes back into dv's PSUM accumulator. The attention's -Di = -rowsum(da a) is
    -rowsum(dy y): da and y are orthogonal to u and a = y + c u (made from dO and o before these units,
    `_seq_units`). Units of one block each, so that `spread` spreads them between the steps."""
    B, T, H, K, G, R, P, dt, scale = c["dims"]
    nt, n, tail = cdiv(T, P), T // P, T % P
    dy3, y3 = st["do"].reshape((P, nt, H * K)), st["o"].reshape((P, nt, H * K))
    parts = ([(P, 0, n)] if n else []) + ([(tail, n, 1)] if tail else [])
    x = {"prod": [None] * R, "nega": [None] * R}

    def products(r):  # dy u of head r (GpSimd); its row sums a stage later (`sums`)
        h = g * R + r
        x["prod"][r] = nl.ndarray((P, nt, K), dtype=nl.float32, buffer=nl.sbuf)
        for rows, i0, m in parts:
            nisa.tensor_tensor(dst=x["prod"][r][0:rows, i0:i0 + m], data1=dy3[0:rows, i0:i0 + m, h * K:(h + 1) * K],
                               data2=x["u"][0:rows, i0:i0 + m], op=nl.multiply, engine=nisa.engine.gpsimd)

    def sums(r):
        x["nega"][r] = nl.ndarray((P, nt), dtype=nl.float32, buffer=nl.sbuf)  # -(dy . u)
        for rows, i0, m in parts:
            nisa.tensor_reduce(dst=x["nega"][r][0:rows, i0:i0 + m], op=nl.add, data=x["prod"][r][0:rows, i0:i0 + m],
                               axis=2, negate=True)

    def rows_of(r, i, rows):
        h = g * R + r
        hk = slice(h * K, (h + 1) * K)
        u, w, nega = x["u"], x["w"], x["nega"][r]
        d, y, w_i, a_i = dy3[0:rows, i, hk], y3[0:rows, i, hk], w[0:rows, i], nega[0:rows, i:i + 1]
        nisa.scalar_tensor_tensor(dst=d, data=u[0:rows, i], op0=nl.multiply, operand0=a_i, op1=nl.add,
                                  operand1=d)  # da
        if r == 0:
            nisa.tensor_scalar(dst=w_i, data=y, op0=nl.multiply, operand0=a_i)
        else:
            nisa.scalar_tensor_tensor(dst=w_i, data=y, op0=nl.multiply, operand0=a_i, op1=nl.add, operand1=w_i)
        nisa.scalar_tensor_tensor(dst=w_i, data=d, op0=nl.multiply, operand0=block(st["negc"], i, h, H, 1)[0:rows],
                                  op1=nl.add, operand1=w_i)

    def dv_of(i, rows):
        nisa.tensor_scalar(dst=x["dvx"][0:rows, i], data=x["w"][0:rows, i], op0=nl.multiply,
                           operand0=x["inv"][0:rows, i:i + 1])
        transpose(natural_cols(js["dvxT"], i, T, True), x["dvx"][0:rows, i], rows, K, c["bias"].ident,
                  on_vector=True)

    x["u"], x["inv"], units = xsa_units(st["v"], G, g, T)
    x["w"] = nl.ndarray((P, nt, K), dtype=nl.float32, buffer=nl.sbuf)  # -(sum c da + (dy . u) y)
    x["dvx"] = nl.ndarray((P, nt, K), dtype=dt, buffer=nl.sbuf)
    js["dvxT"] = nl.ndarray((K, T), dtype=dt, buffer=nl.sbuf)
    units += [lambda r=r: products(r) for r in range(R)]
    for r in range(R):
        units += [lambda r=r: sums(r)]
        units += [lambda r=r, i=i, rows=rows: rows_of(r, i, rows) for i, _, rows in row_tiles(T)]
    return units + [lambda i=i, rows=rows: dv_of(i, rows) for i, _, rows in row_tiles(T)]
