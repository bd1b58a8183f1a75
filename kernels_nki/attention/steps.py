"""The per-tile stages of the attention kernels (a kernel-helper file): the score matmul both directions share
(`scores`), the bounded forward's (chunk, key tile, head) steps per kv head (`bounded_heads`, `bounded_out`), the
backward's (query tile, key chunk, head) steps (`bwd_tile`, `bwd_scores`, `bwd_values`, `bwd_dq`, `bwd_heads`), the
backward's dk / dv evacuation (`store_kv_grad`) and gain sum (`gain_grad`). The steps run as `kernels_nki.tiles.
pipeline` stage tables, with side work spread between them (`spread`); why the order: docs/kernels/attention.md,
"Instruction order".
"""

import nki.isa as nisa
import nki.language as nl

from kernels_nki.attention.layout import block, perm_rows
from kernels_nki.attention.rows import half_matmul, head_rows
from kernels_nki.attention.state import QueryTile, RowNorm
from kernels_nki.attention.xsa import xsa_out
from kernels_nki.tiles import cdiv, pipeline, row_tiles, transpose, transpose_to_psum

KC = 512  # keys (queries in the bounded forward) per chunk: one fp32 PSUM bank of scores (gemm_moving_fmax)
BWD_LAG = 1  # the backward's steps between a step's two halves: its dq matmuls already wait a step (`bwd_heads`)
LAG = 2  # the bounded forward's steps between a step's two halves


def scores(qT, kT, t0, rows, c0, kc, bias, masked):
    """Raw scores q k^T of the query rows against keys c0:c0+kc in fp32 PSUM; with `masked` (the forward)
    the diagonal block gets the causal bias by a 0/1-stationary matmul (the backward masks p instead); on the
    whole PE array (q^T and k^T sit on partitions 0 .. K: `half_matmul`)."""
    K = qT.shape[0]
    P = nl.tile_size.pmax
    s_ps = nl.ndarray((P, KC), dtype=nl.float32, buffer=nl.psum)
    half_matmul(s_ps[0:rows, 0:kc], qT[0:K, 0:rows], kT[0:K, c0:c0 + kc], None)
    if masked and c0 + kc == t0 + rows:  # the chunk ends with the diagonal block (keys t0 .. t0+rows): += I^T bias
        nisa.nc_matmul(dst=s_ps[0:rows, t0 - c0:t0 - c0 + rows], stationary=bias.ident[0:rows, 0:rows],
                       moving=bias.mask[0:rows, 0:rows], accumulate=True, is_stationary_onezero=True)
    return s_ps


def run_stages(stages):
    """Runs stages (callables) now, in order, each dropped from the list once run (its tiles released)."""
    for k in range(len(stages)):
        stage = stages[k]
        stages[k] = None
        stage()


def spread(side, n):
    """Side work spread evenly over n steps: side is a list of units (callables, run in order, each dropped from the
    list once run so that its tiles are released; a unit may append more).

    Returns:
        stage(s), a stage-table row at offset 0: runs units while fewer than (s + 1) len(side) // n have run,
        len(side) read after each unit, so that step n - 1 runs every unit left, those the units append included.
    """
    ran = {"units": 0}

    def run_one():
        unit = side[ran["units"]]
        side[ran["units"]] = None
        unit()
        ran["units"] += 1

    def stage(s):
        while ran["units"] < (s + 1) * len(side) // n:
            run_one()
    return stage


def bounded_heads(qTs, kT, vs, negms, outs, hs, scale, dt, ident, maskT, side=(), xsa=()):
    """Query heads hs of one kv head in the bounded forward: per head and chunk of KC queries c0:c0+n, against keys
    0 .. c0+n, o' for the chunk's query tiles in one PSUM bank, then o and lse (`bounded_out`).

    Args:
        qTs, kT, vs: the heads' q^T [K, T], k^T [K, T], the [v | 1] tiles.
        negms: the heads' shift columns -m_h.
        outs: (o seq tile in the `perm` layout, lse columns, H): o by `perm_rows` once a head is done.
        maskT: the key-major causal bias ([128, 128], NEG where key > query).
        side: units of side work (`spread`).
        xsa: () or (the kv head's unit values u, the sequence's o . u columns): XSA on each chunk's o as it is made.

    Notes:
        The (chunk c, key tile j, head r) steps, the heads interleaved (independent chains side by side):

            pipeline(steps, [(0, scores),    # s^T = k_j q^T (+ the diagonal's mask), p^T = exp(scale s^T - m_h)
                             (LAG, values),  # o' += p^T [v | 1]; a chunk's end: `bounded_out` halves a step apart
                             (0, side)])     # the side units due by this step
    """
    first, *_ = qTs
    K = first.shape[0]
    T = kT.shape[1]
    P = nl.tile_size.pmax
    W = K + 1
    o_sb, lse_sb, H = outs
    o_ps = [[] for _ in hs]  # per head, its open chunks' o' PSUM tiles, oldest first
    o_nat = [nl.ndarray((P, cdiv(T, P) * K), dtype=dt, buffer=nl.sbuf) for _ in hs]  # per head, o in natural blocks

    def scores(n_st):
        c, j, r = steps[n_st]
        c0, n = c * KC, min(KC, T - c * KC)
        if j == 0:
            o_ps[r].append(nl.ndarray((P, (KC // P) * W), dtype=nl.float32, buffer=nl.psum))
        k0 = j * P
        kr = min(P, T - k0)
        q0 = max(c0, k0)  # the first query of the chunk that sees key tile j
        nj = c0 + n - q0
        sT_ps = nl.ndarray((P, KC), dtype=nl.float32, buffer=nl.psum)
        half_matmul(sT_ps[0:kr, 0:nj], kT[0:K, k0:k0 + kr], qTs[r][0:K, q0:q0 + nj], None)
        if k0 >= c0:  # the diagonal block leads: += I^T maskT, NEG where key > query, so that p^T = 0 there
            nisa.nc_matmul(dst=sT_ps[0:kr, 0:kr], stationary=ident[0:kr, 0:kr], moving=maskT[0:kr, 0:kr],
                           accumulate=True, is_stationary_onezero=True)
        pT = nl.ndarray((P, KC), dtype=dt, buffer=nl.sbuf)
        nisa.activation(dst=pT[0:kr, 0:nj], op=nl.exp, data=sT_ps[0:kr, 0:nj], bias=negms[r][0:kr], scale=scale)
        pTs.append(pT)

    def values(n_st):
        c, j, r = steps[n_st]
        pT = pTs.pop(0)
        o_open, *_ = o_ps[r]
        c0, n = c * KC, min(KC, T - c * KC)
        k0 = j * P
        kr = min(P, T - k0)
        q0 = max(c0, k0)
        for i in range(cdiv(n, P)):
            t0 = c0 + i * P
            if t0 >= k0:
                rows = min(P, c0 + n - t0)
                nisa.nc_matmul(dst=o_open[0:rows, i * W:(i + 1) * W],
                               stationary=pT[0:kr, t0 - q0:t0 - q0 + rows], moving=vs[j][0:kr, 0:W],
                               accumulate=j > 0)
        for f in xlate:  # the XSA of the chunk ends before those (`xsa_out`'s second half)
            f()
        xlate.clear()
        for f in late:  # the previous chunk ends' second halves (a step late: docs/kernels/attention.md)
            xlate.extend(f())
        late.clear()
        if k0 + P >= c0 + n:
            late.append(bounded_out(o_ps[r].pop(0), c0, n, negms[r], (o_nat[r], lse_sb, H), hs[r], K, xsa))

    steps = [(c, j, r) for c in range(cdiv(T, KC)) for j in range(cdiv(min(T, (c + 1) * KC), P))
             for r in range(len(hs))]
    late, xlate, pTs = [], [], []  # chunk ends' second halves, XSA's; the scores' p^T tiles, oldest first
    pipeline(len(steps), [(0, scores), (LAG, values), (0, spread(side, len(steps)))])
    for f in late:
        xlate.extend(f())
    for f in xlate:
        f()
    for r in range(0, len(hs), 2):  # o: natural 128-row blocks -> the batch's `perm` o tile, two heads at once
        pair = slice(r, min(len(hs), r + 2))
        perm_rows(o_sb, H, tuple(hs[pair]), tuple(o_nat[pair]), T, ident, dt)


def bounded_out(o_ps, c0, n, negm_P1, outs, h, K, xsa=()):
    """o = o' / l and lse = m_h + log(l) of one chunk's query tiles into the batch's SBUF tiles, in two halves:
    1 / l (VectorE) and log(l) (ScalarE) now, and -> a callable issuing what waits for them (o' times 1 / l on
    ScalarE, lse on VectorE, then with xsa = (u, c columns) the first half of XSA's epilogue on the chunk's o,
    `xsa_out`) and returning the callables left (XSA's second half), which `bounded_heads` issues a step later
    each; when every tile is full, 1 / l and lse for all of them at once (their l columns and lse columns are
    strided views)."""
    P = nl.tile_size.pmax
    W = K + 1
    o_sb, lse_sb, H = outs
    if n % P == 0:
        m, s0 = n // P, (c0 // P) * H + h
        l_ps = o_ps[0:P, K:m * W:W]
        inv = nl.ndarray((P, KC // P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv[0:P, 0:m], data=l_ps)
        lse = lse_sb[0:P, s0:s0 + (m - 1) * H + 1:H]  # m_h + log(l)
        nisa.activation(dst=lse, op=nl.log, data=l_ps)

        def rest():
            for i in range(m):
                nisa.activation(dst=block(o_sb, c0 // P + i, 0, 1, K), op=nl.copy,
                                data=o_ps[0:P, i * W:i * W + K], scale=inv[0:P, i:i + 1])  # ScalarE: VectorE's
                # PSUM read would hold the SBUF port too
            nisa.tensor_scalar(dst=lse, data=lse, op0=nl.subtract, operand0=negm_P1[0:P])
            if xsa:
                u, c_sb = xsa
                return [xsa_out(o_sb, c0 // P, m, P, u, c_sb, h, H)]
            return []
        return rest
    for i in range(cdiv(n, P)):
        t0 = c0 + i * P
        rows = min(P, c0 + n - t0)
        l_ps = o_ps[0:rows, i * W + K:(i + 1) * W]
        inv_P1 = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_P1[0:rows], data=l_ps)
        o_t = block(o_sb, t0 // P, 0, 1, K)  # the head's natural blocks
        nisa.tensor_scalar(dst=o_t[0:rows], data=o_ps[0:rows, i * W:i * W + K], op0=nl.multiply,
                           operand0=inv_P1[0:rows])
        lse_P1 = block(lse_sb, t0 // P, h, H, 1)  # m_h + log(l)
        nisa.activation(dst=lse_P1[0:rows], op=nl.log, data=l_ps)
        nisa.tensor_scalar(dst=lse_P1[0:rows], data=lse_P1[0:rows], op0=nl.subtract, operand0=negm_P1[0:rows])
        if xsa:
            u, c_sb = xsa
            xsa_out(o_sb, t0 // P, 1, rows, u, c_sb, h, H)()
    return lambda: []


def bwd_tile(views, t0, rows, bias, dt, qk=()):
    """One 128-query tile of a head in the backward.

    Args:
        views: its [P, K] view of q, (dO, dO^T [K, rows]), its -Di = -rowsum(dO o) and -lse columns and its dq view
            (`block`).
        qk: () or (its `RopeTile`, the head's `Gain`, (qg, qinv, qg^T views)): q is the forward's normed, rotated rows.

    Returns:
        Its `QueryTile`.
    """
    q_v, (do_t, doT), negdi_P1, negl_P1, dq_t = views
    tables, saved = (), ()
    if qk:
        tables, gain, saved = qk
    q_t, qT, norm = head_rows(q_v, rows, dt, bias.ident, saved=saved)
    if qk:  # dq's final scale, inv gain (`prep_grad`), made now: off the gradient's chain
        s_P1 = nl.ndarray((nl.tile_size.pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=s_P1[0:rows], data=norm.inv[0:rows], op0=nl.multiply, operand0=gain.col[0:rows],
                           op1=nl.multiply, operand1=q_v.shape[1] ** -0.5)
        norm = RowNorm(xn=norm.xn, inv=s_P1, xk=norm.xk)
    return QueryTile(q=q_t, qT=qT, norm=norm, do=do_t, doT=doT, negl=negl_P1, negdi=negdi_P1, t0=t0, rows=rows,
                     dq=dq_t, tables=tables)


def bwd_scores(tile, c0, kc, kT, vT, bias, scale, dt, half=None):
    """First half of a (query tile, key chunk) step: p = exp(scale s - lse) recomputed (no max, no sum, the diagonal
    block masked in the scores), and ds = p (dp - Di), dp = dO v^T on the PE array's row tile `half` where dO^T and
    v^T sit on one half of the partitions (else, None, on the whole array). -> (p, ds) in SBUF.

    Notes:
        dp - Di leaves PSUM on ScalarE (its bias), the product with p runs on GpSimd (both operands in SBUF):
        VectorE and GpSimd share the SBUF port, so the VectorE forms would cost that port.
    """
    rows = tile.rows
    K = tile.qT.shape[0]
    P = nl.tile_size.pmax
    s_ps = scores(tile.qT, kT, tile.t0, rows, c0, kc, bias, True)  # NEG above the diagonal: exp gives p = 0
    p_t = nl.ndarray((P, KC), dtype=dt, buffer=nl.sbuf)
    nisa.activation(dst=p_t[0:rows, 0:kc], op=nl.exp, data=s_ps[0:rows, 0:kc], bias=tile.negl[0:rows], scale=scale)
    dp_ps = nl.ndarray((P, KC), dtype=nl.float32, buffer=nl.psum)
    half_matmul(dp_ps[0:rows, 0:kc], tile.doT[0:K, 0:rows], vT[0:K, c0:c0 + kc], half)
    t_f = nl.ndarray((P, KC), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=t_f[0:rows, 0:kc], op=nl.copy, data=dp_ps[0:rows, 0:kc], bias=tile.negdi[0:rows])
    ds_t = nl.ndarray((P, KC), dtype=dt, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=ds_t[0:rows, 0:kc], data1=t_f[0:rows, 0:kc], data2=p_t[0:rows, 0:kc], op=nl.multiply,
                       engine=nisa.engine.gpsimd)
    return p_t, ds_t


def bwd_values(tile, c0, kc, p_t, ds_t, dq_ps, k_tiles, acc, ident, dt, first_head):
    """Second half of a step, per 128-key block j of the chunk: dv += p^T dO, dk += ds^T q (acc: the kv head's
    `KvAcc`, accumulating across its query heads and tiles, KC / K key blocks to a bank: each block's accumulation
    opened by an explicit overwrite at its diagonal query tile of the `first_head`), dq += ds k (ds^T by a
    transpose; every block's first, their PSUM copy on ScalarE: VectorE's would hold the PSUM port and GpSimd's
    the SBUF port, both busier than ScalarE's share of the step). -> a callable issuing the dq matmuls (which wait
    for the copies: `bwd_heads` issues them a step later)."""
    q_t, do_t, t0, rows = tile.q, tile.do, tile.t0, tile.rows
    K = q_t.shape[1]
    P = nl.tile_size.pmax
    per_bank = KC // K
    blocks = [(j, c0 // P + j, kr) for j, _, kr in row_tiles(kc)]
    dsT = nl.ndarray((P, KC), dtype=dt, buffer=nl.sbuf)
    if rows == P and kc % P == 0:  # every block full: all the chunk's ds^T leave PSUM in one instruction
        t_ps = nl.ndarray((P, KC), dtype=nl.float32, buffer=nl.psum)
        for j, kt, kr in blocks:
            transpose_to_psum(t_ps[0:P, j * P:(j + 1) * P], ds_t[0:P, j * P:(j + 1) * P], P, ident)
        nisa.activation(dst=dsT[0:P, 0:kc], op=nl.copy, data=t_ps[0:P, 0:kc])
    else:
        for j, kt, kr in blocks:
            transpose(dsT[0:kr, j * P:j * P + rows], ds_t[0:rows, j * P:j * P + kr], rows, kr, ident)
    dsTs = [dsT[:, j * P:(j + 1) * P] for j, _, _ in blocks]
    for j, kt, kr in blocks:
        cols, col = slice(j * P, j * P + kr), (kt % per_bank) * K
        dk_acc, dv_acc = acc.dk[kt // per_bank], acc.dv[kt // per_bank]
        more = not (first_head and kt == t0 // P)  # key block kt's first query tile is its diagonal one
        nisa.nc_matmul(dst=dv_acc[0:kr, col:col + K], stationary=p_t[0:rows, cols], moving=do_t[0:rows, 0:K],
                       accumulate=more)
        nisa.nc_matmul(dst=dk_acc[0:kr, col:col + K], stationary=ds_t[0:rows, cols], moving=q_t[0:rows, 0:K],
                       accumulate=more)

    def dq():
        for (j, kt, kr), dsT in zip(blocks, dsTs):
            nisa.nc_matmul(dst=dq_ps[0:rows, 0:K], stationary=dsT[0:kr, 0:rows], moving=k_tiles[kt][0:kr, 0:K])
    return dq


def bwd_dq(tile, dq_ps, scale, qk):
    """dq of a tile out of PSUM (times scale) into its view; with qk -> the `prep_grad` item it still needs (run once
    per head for every tile together), else ()."""
    K = tile.q.shape[1]
    P = nl.tile_size.pmax
    rows = tile.rows
    if not qk:
        nisa.activation(dst=tile.dq[0:rows], op=nl.copy, data=dq_ps[0:rows, 0:K], scale=scale)
        return ()
    d_f = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d_f[0:rows], op=nl.copy, data=dq_ps[0:rows, 0:K], scale=scale)
    return (tile.dq, d_f, rows, tile.tables, tile.norm)


def bwd_heads(tiles, kT, vTs, k_tiles, acc, bias, scale, dt, qk, side=(), halves=None):
    """The query heads of one kv head in the backward.

    Args:
        tiles: tiles[r][i], the `QueryTile`s of head r.
        vTs: v^T per head (the same tile, or the half beside a stacked head's dO^T).
        acc: the kv head's `KvAcc`.
        qk: the dq items go on through `prep_grad`.
        side: units of side work (`spread`).
        halves: the row tile of each head's dp matmul where its operands sit on one half of the partitions, else
            None.

    Returns:
        Per head the `prep_grad` items of its tiles (with qk).

    Notes:
        The (query tile i, key chunk c, head r) steps, the heads interleaved:

            pipeline(steps, [(0, first),         # p, ds (`bwd_scores`)
                             (BWD_LAG, second),  # the last step's dq matmuls, dv / dk (`bwd_values`),
                                                 # the tiles finished before out of PSUM (`bwd_dq`)
                             (0, side)])         # the side units due by this step
    """
    T = kT.shape[1]
    K = kT.shape[0]
    P = nl.tile_size.pmax
    R = len(tiles)
    nt = cdiv(T, P)
    dq_open = [[] for _ in range(R)]
    items = [[] for _ in range(R)]
    # a step's dq matmuls wait for its ds^T copies: issued in the next step's second half, after the scores of
    # the steps in between, and a finished tile's dq leaves PSUM after them
    late, done, halves_done = [], [], []

    def catch_up():
        for dq in late:
            dq()
        late.clear()
        finished = list(done)
        done.clear()
        return finished

    def evacuate(finished):
        for r, tile, dq_ps in finished:
            items[r].append(bwd_dq(tile, dq_ps, scale, qk))

    def first(n):
        i, c, r = steps[n]
        tile = tiles[r][i]
        halves_done.append(bwd_scores(tile, c * KC, min(KC, tile.t0 + tile.rows - c * KC), kT, vTs[r], bias, scale,
                                      dt, halves[r] if halves else None))

    def second(n):
        i, c, r = steps[n]
        tile = tiles[r][i]
        p_t, ds_t = halves_done.pop(0)
        if c == 0:
            dq_open[r].append(nl.ndarray((P, K), dtype=nl.float32, buffer=nl.psum))
        finished = catch_up()
        dq_ps, *_ = dq_open[r]
        late.append(bwd_values(tile, c * KC, min(KC, tile.t0 + tile.rows - c * KC), p_t, ds_t, dq_ps, k_tiles, acc,
                               bias.ident, dt, r == 0))
        evacuate(finished)
        if (c + 1) * KC >= tile.t0 + tile.rows:
            done.append((r, tile, dq_open[r].pop(0)))

    steps = [(i, c, r) for i in range(nt) for c in range(cdiv(min(T, (i + 1) * P), KC)) for r in range(R)]
    pipeline(len(steps), [(0, first), (BWD_LAG, second), (0, spread(side, len(steps)))])
    evacuate(catch_up())
    return items


def store_kv_grad(dst_sb, G, acc, g, T, K, scale, dt, tables=(), norms=()):
    """Evacuate a kv head's PSUM accumulator (times scale) into head g of dst_sb (the batch's `seq_tile`) in
    dt; with `tables` (cos/sin tiles) -> the `prep_grad` items taking them through the rotation and QK-norm of
    the keys (their per-tile `norms`), else []."""
    P = nl.tile_size.pmax
    per_bank = KC // K
    items = []
    for kt, _, kr in row_tiles(T):
        col = (kt % per_bank) * K
        out = block(dst_sb, kt, g, G, K)
        if tables:
            d_f = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=d_f[0:kr], op=nl.copy, data=acc[kt // per_bank][0:kr, col:col + K], scale=scale)
            items.append((out, d_f, kr, tables[kt], norms[kt]))
        else:
            nisa.activation(dst=out[0:kr], op=nl.copy, data=acc[kt // per_bank][0:kr, col:col + K], scale=scale)
    return items


def gain_grad(dg_1H, dg_P1, h, K):
    """dg_1H[0, h] = -K times the sum over partitions of dg_P1 (fp32, -1 / K times the gain's gradient per row:
    `prep_grad`): one matmul against a ones column."""
    P = nl.tile_size.pmax
    ones_P1 = nl.ones((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    s_ps = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps, stationary=dg_P1, moving=ones_P1)
    nisa.tensor_scalar(dst=dg_1H[0:1, h:h + 1], data=s_ps, op0=nl.multiply, operand0=-float(K))
