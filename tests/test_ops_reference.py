"""The references (frontier_jax.ops.reference), the kernels' spec, against the mathematics they stand for: each is
checked against a naive float64 NumPy form written from its definition (RMSNorm, rotary embedding, causal GQA
softmax attention, the relu^2 MLP, the embedding gather, softcapped cross-entropy with a sparse bias, Adam),
for its invariances (scale, rotation, causality, rows that sum to one), and every hand-written backward
against jax.vjp of its forward. Small fp32 shapes; nothing is compiled beyond JAX's op-by-op dispatch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from frontier_jax.ops import reference as ref

RNG = np.random.default_rng(0)
B, T, H, G, K, D, F, V = 2, 8, 4, 2, 8, 16, 32, 24


def _normal(*shape, scale=1.0):
    return jnp.asarray(scale * RNG.standard_normal(shape), jnp.float32)


def _close(a, b, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol)


def _vjp_equals(fwd, bwd_args, bwd, primals, cotangent, rtol=1e-5, atol=1e-5):
    """The hand-written backward `bwd(*bwd_args, cotangent)` equals jax.vjp of `fwd` at `primals`."""
    want = jax.jit(lambda p, ct: jax.vjp(fwd, *p)[1](ct))(primals, cotangent)
    got = jax.jit(bwd)(*bwd_args, cotangent)
    assert len(got) >= len(want)
    for g, w in zip(got, want):
        _close(g, w, rtol, atol)


def _naive_rms_norm(x):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + ref.RMS_EPS)


def test_rms_norm_is_scale_invariant_with_unit_rms_rows_and_its_backward_is_the_vjp():
    x = _normal(6, D)
    y = ref.rms_norm(x)
    _close(y, _naive_rms_norm(x))
    _close(np.sqrt(np.mean(np.square(np.asarray(y)), axis=-1)), np.ones(6))
    for c in (0.5, 3.0, 250.0):  # rms_norm(c x) = rms_norm(x) while eps is negligible beside mean(x^2)
        _close(ref.rms_norm(c * x), y, rtol=1e-5, atol=1e-5)
    _close(ref.rms_norm(1e-3 * x), _naive_rms_norm(1e-3 * x))  # and eps keeps a tiny row from blowing up
    _, inv = ref.rms_norm_fwd(x)
    _vjp_equals(ref.rms_norm, (x, inv), ref.rms_norm_bwd, (x,), _normal(6, D))


def test_rope_rotates_each_pair_by_its_position_angle_and_its_backward_rotates_back():
    cos, sin = ref.rope_tables(T, K, 10000.0)
    x = _normal(B, T, H, K)
    y = np.asarray(ref.rope(x, cos, sin), np.float64)
    half = K // 2
    x64 = np.asarray(x, np.float64)
    x1, x2 = x64[..., :half], x64[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    _close(y, np.concatenate([x1 * c + x2 * s, x2 * c - x1 * s], axis=-1))
    _close(y[..., :half] ** 2 + y[..., half:] ** 2, x1 ** 2 + x2 ** 2)  # a rotation keeps each pair's length
    _close(y[:, 0], x64[:, 0])  # position 0: angle 0
    _vjp_equals(lambda a: ref.rope(a, cos, sin), (), lambda dy: ref.rope_bwd(dy, cos, sin), (x,), _normal(B, T, H, K))
    _close(ref.rope_bwd(ref.rope(x, cos, sin), cos, sin)[0], x)  # the inverse rotation


def _naive_attention(q, k, v):
    """softmax(q k^T / sqrt(K) + causal mask) v with the G kv heads shared by H / G query heads, float64."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    R = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, R, axis=2), np.repeat(v, R, axis=2)
    s = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((q.shape[1], q.shape[1]), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshk->bthk", p, v)


@pytest.mark.parametrize("block", [None, 0, 2])
def test_causal_attention_is_the_naive_masked_softmax_for_every_block_length(block):
    q, k, v = _normal(B, T, H, K), _normal(B, T, G, K), _normal(B, T, G, K)
    _close(jax.jit(ref.causal_attention, static_argnums=3)(q, k, v, block), _naive_attention(q, k, v))


def test_causal_attention_sees_no_future_and_its_rows_sum_to_one():
    q, k, v = _normal(B, T, H, K), _normal(B, T, G, K), _normal(B, T, G, K)
    o = np.asarray(ref.causal_attention(q, k, v))
    k2, v2 = k.at[:, 5:].set(_normal(B, T - 5, G, K)), v.at[:, 5:].set(_normal(B, T - 5, G, K, scale=9.0))
    o2 = np.asarray(ref.causal_attention(q, k2, v2))
    _close(o2[:, :5], o[:, :5])  # positions 0..4 read keys 0..4 only
    assert not np.allclose(o2[:, 5:], o[:, 5:])
    _close(ref.causal_attention(q, k, jnp.ones_like(v)), np.ones((B, T, H, K)))  # a convex combination of values
    _close(ref.causal_attention(q, k, v)[:, 0], np.repeat(np.asarray(v)[:, 0], H // G, axis=1))  # t = 0: v_0


def test_attention_backward_and_lse_are_the_vjp_and_the_log_normaliser():
    q, k, v = _normal(B, T, H, K), _normal(B, T, G, K), _normal(B, T, G, K)
    o, lse = ref.attention_fwd(q, k, v)
    s = np.einsum("bthk,bshk->bhts", np.asarray(q, np.float64), np.repeat(np.asarray(k, np.float64), H // G, 2))
    s = np.where(np.tril(np.ones((T, T), bool)), s / np.sqrt(K), -np.inf)
    _close(lse[..., 0], np.log(np.sum(np.exp(s), axis=-1)), rtol=1e-5, atol=1e-5)
    fwd = lambda a, b, c: _dense_attention(a, b, c)
    _vjp_equals(fwd, (q, k, v, o, lse), ref.attention_bwd, (q, k, v), _normal(B, T, H, K), rtol=1e-4, atol=1e-5)


def _dense_attention(q, k, v):
    """The same attention in plain jnp (autodiff's reference for the hand-written backward)."""
    R = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, R, axis=2), jnp.repeat(v, R, axis=2)
    s = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(jnp.tril(jnp.ones((q.shape[1], q.shape[1]), bool)), s, -jnp.inf)
    return jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(s, axis=-1), v)


def test_qk_attention_forward_and_backward_are_the_composed_references_and_their_vjp(xsa_on=True):
    """With XSA (which composes the attention's backward, so one case covers both): the forward's o is
    xsa(attention), xc each row's attention . u (u: its kv head's unit value; without XSA an empty [B, H, T, 0]),
    and the hand-written backward (reference.xsa_bwd, then the attention's) is autodiff's vjp."""
    q, k, v = _normal(B, T, H, K), _normal(B, T, G, K), _normal(B, T, G, K)
    cos, sin = ref.rope_tables(T, K, 10000.0)
    gain = jnp.asarray([0.5, 1.0, 1.5, 2.0], jnp.float32)
    normed = lambda a, b: (ref.rope_gain(ref.rms_norm(a), cos, sin, gain), ref.rope(ref.rms_norm(b), cos, sin))
    qg, kr = jax.jit(normed)(q, k)
    a = _naive_attention(qg, kr, v)
    want = ref.xsa(jnp.asarray(a, jnp.float32), v) if xsa_on else a
    _close(jax.jit(ref.qk_attention, static_argnums=6)(q, k, v, cos, sin, gain, xsa_on), want, rtol=1e-4, atol=1e-5)
    g_PH = jnp.broadcast_to(gain, (128, H))
    saved = jax.jit(ref.qk_attention_fwd, static_argnames="xsa_on")(q, k, v, cos, sin, g_PH, xsa_on=xsa_on)
    _close(saved[0], want, rtol=1e-4, atol=1e-5)
    u = np.asarray(v, np.float64) / np.linalg.norm(np.asarray(v, np.float64), axis=-1, keepdims=True)
    xc = np.einsum("btgrk,btgk->bgrt", np.asarray(a, np.float64).reshape(B, T, G, H // G, K), u)
    assert saved[-1].shape == (B, H, T, 1)
    assert jax.eval_shape(ref.qk_attention_fwd, q, k, v, cos, sin, g_PH)[-1].shape == (B, H, T, 0)
    _close(saved[-1][..., 0], xc.reshape(B, H, T), rtol=1e-4, atol=1e-5)
    do = _normal(B, T, H, K)
    bwd = jax.jit(ref.qk_attention_bwd, static_argnames="xsa_on")
    dq, dk, dv, dg_BH1 = bwd(q, k, v, cos, sin, g_PH, *saved, do, xsa_on=xsa_on)
    attend = lambda a, b, c, g: ref.qk_attention(a, b, c, cos, sin, g, xsa_on)
    vjp = jax.jit(lambda a, b, c, g, ct: jax.vjp(attend, a, b, c, g)[1](ct))
    wq, wk, wv, wg = vjp(q, k, v, gain, do)
    for got, w in ((dq, wq), (dk, wk), (dv, wv), (dg_BH1[..., 0].sum(0), wg)):
        _close(got, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("slope", [0.0, 0.5, 1.5])
def test_norm_mlp_is_the_naive_leaky_relu_squared_mlp_of_the_normed_input_and_its_backward_the_vjp(slope):
    """LeakyReLU(slope)^2 (0: the baseline's relu^2, 0.5: the record's, 1.5: a slope > 1); the hand-written backward
    reads the activation's derivative off the stored r = act(h) (r act'(h) = act(r) for a slope >= 0)."""
    x, w_fc, w_proj = _normal(6, D), _normal(D, F, scale=0.3), _normal(F, D, scale=0.3)
    h = _naive_rms_norm(x) @ np.asarray(w_fc, np.float64)
    h = np.where(h > 0, h, slope * h)
    _close(ref.norm_mlp(x, w_fc, w_proj, slope), (h * h) @ np.asarray(w_proj, np.float64), rtol=1e-4, atol=1e-5)
    y, inv, rT = ref.resid_norm_mlp_fwd(x, w_fc, w_proj, negative_slope=slope)
    _close(y, np.asarray(x) + (h * h) @ np.asarray(w_proj, np.float64), rtol=1e-4, atol=1e-5)
    _close(rT.T, h, rtol=1e-4, atol=1e-5)  # the stored hidden layer act(h), transposed
    bwd = lambda *a: ref.resid_norm_mlp_bwd(*a, negative_slope=slope)
    _vjp_equals(lambda a, b, c: a + ref.norm_mlp(a, b, c, slope), (x, w_fc, w_proj, inv, rT), bwd,
                (x, w_fc, w_proj), _normal(6, D), rtol=1e-4, atol=1e-5)


def test_embed_gathers_rows_and_its_backward_sums_duplicate_ids():
    emb, ids = _normal(V, D), jnp.asarray([3, 0, 3, 7, 3], jnp.int32)
    _close(ref.embed(ids, emb), np.asarray(emb)[np.asarray(ids)])
    dy = _normal(5, D)
    demb = np.asarray(ref.embed_bwd(ids, emb, dy)[0])
    _close(demb[3], np.asarray(dy)[[0, 2, 4]].sum(0))  # three uses of row 3
    assert not demb[[1, 2, 4, 5, 6]].any()  # rows never gathered get nothing
    _vjp_equals(lambda e: ref.embed(ids, e), (ids, emb), ref.embed_bwd, (emb,), dy)


def _naive_head_loss(x, emb, targets, softcap, ids=None, vals=None):
    z = np.asarray(x, np.float64) @ np.asarray(emb, np.float64).T
    logits = softcap * np.tanh(z / softcap)
    if ids is not None:
        for n in range(logits.shape[0]):
            for s in range(ids.shape[1]):
                logits[n, int(ids[n, s])] += float(vals[n, s])
    lse = np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) + logits.max(-1)
    return lse - logits[np.arange(len(targets)), np.asarray(targets)]


def test_head_loss_is_softcapped_cross_entropy_with_a_sparse_bias_and_its_backward_the_vjp():
    N, S, cap = 6, 3, 5.0
    x, emb, tg = _normal(N, D), _normal(V, D), jnp.asarray(RNG.integers(0, V, N), jnp.int32)
    head_loss = jax.jit(ref.head_loss, static_argnums=3)
    _close(head_loss(x, emb, tg, cap), _naive_head_loss(x, emb, tg, cap), rtol=1e-5, atol=1e-5)
    ids = jnp.asarray(RNG.integers(0, V, (N, S)), jnp.int32).at[:, 2].set(tg)  # the bias also names the target
    ids = ids.at[0, 1].set(ids[0, 0])  # two sources naming the same token add up
    vals = _normal(N, S)
    _close(head_loss(x, emb, tg, cap, ids, vals), _naive_head_loss(x, emb, tg, cap, ids, vals), rtol=1e-5,
           atol=1e-5)
    assert np.all(np.abs(np.asarray(ref.head_logits(x, emb, cap))) < cap)  # the softcap bounds every logit
    loss, lse = jax.jit(lambda *a: ref.head_loss_fwd(*a, softcap=cap))(x, emb, tg[:, None], ids, vals)
    dloss = _normal(N, 1)
    _vjp_equals(lambda a, b, c: ref.head_loss_fwd(a, b, tg[:, None], ids, c, softcap=cap)[0],
                (x, emb, tg[:, None], ids, vals, lse), lambda *a: ref.head_loss_bwd(*a, softcap=cap),
                (x, emb, vals), dloss)


def test_adam_update_is_the_textbook_step_and_newton_schulz_orthogonalises():
    p, g, m, v = _normal(5, 3), _normal(5, 3), _normal(5, 3, scale=0.1), jnp.abs(_normal(5, 3, scale=0.1))
    lr, b1, b2, eps, t = 0.01, 0.9, 0.95, 1e-8, 3
    scal = jnp.broadcast_to(jnp.asarray([lr, 1 - b1 ** t, 1 - b2 ** t, 0.0], jnp.float32), (128, 4))
    p2, m2, v2 = ref.adam_update(p, g, m, v, scal, b1=b1, b2=b2, eps=eps, weight_decay=0.0)
    P, Gr, M, Vv = (np.asarray(a, np.float64) for a in (p, g, m, v))
    M2, V2 = b1 * M + (1 - b1) * Gr, b2 * Vv + (1 - b2) * Gr ** 2
    _close(m2, M2)
    _close(v2, V2)
    _close(p2, P - lr * (M2 / (1 - b1 ** t)) / (np.sqrt(V2 / (1 - b2 ** t)) + eps), rtol=1e-5, atol=1e-6)
    o = np.asarray(ref.newton_schulz(_normal(8, 16), 5, jnp.float32), np.float64)
    sv = np.linalg.svd(o, compute_uv=False)
    assert 0.5 < sv.min() and sv.max() < 1.5  # the quintic iteration drives singular values towards 1


# ----------------------------------------------------------------------------- the recipe's switches


def _record_partial_rope(x, cos, sin, R):
    """The record's apply_rotary_emb (train_gpt.py:591-597) in float64: the first R dims rotated with dim j paired
    with j + R/2, the rest passed through."""
    x = np.asarray(x, np.float64)
    c, s = np.asarray(cos, np.float64)[None, :, None, :], np.asarray(sin, np.float64)[None, :, None, :]
    x1, x2, rest = x[..., :R // 2], x[..., R // 2:R], x[..., R:]
    return np.concatenate([x1 * c + x2 * s, -x1 * s + x2 * c, rest], axis=-1)


@pytest.mark.parametrize("R", [2, 4, 6])
def test_partial_rope_leaves_dims_from_rope_dims_untouched_and_is_the_records_formula(R):
    cos, sin = ref.rope_tables(T, R, 10000.0)
    x = _normal(B, T, H, K)
    y = ref.rope(x, cos, sin)
    np.testing.assert_array_equal(np.asarray(y)[..., R:], np.asarray(x)[..., R:])  # bit for bit
    _close(y, _record_partial_rope(x, cos, sin, R))
    assert not np.allclose(np.asarray(y)[:, 1:, :, :R], np.asarray(x)[:, 1:, :, :R])  # the first R dims do turn
    _close(ref.rope_bwd(y, cos, sin)[0], x)  # the inverse rotation, on the same dims


def test_the_rope_base_is_rescaled_only_above_the_length_it_is_rescaled_from():
    for T_, R, base in ((2048, 16, 10000.0), (1280, 16, 10000.0), (4096, 8, 500.0), (1025, 64, 10000.0)):
        assert ref.rope_base(T_, R, base, 1024) == pytest.approx(base * (T_ / 1024) ** (R / (R - 2)), rel=1e-15)
    assert ref.rope_base(2048, 16, 10000.0, 1024) == pytest.approx(22081.790273476247, rel=1e-15)  # the record's
    for T_ in (1, 256, 1024):
        assert ref.rope_base(T_, 16, 10000.0, 1024) == 10000.0  # at or below: no rescaling
    assert ref.rope_base(4096, 16, 10000.0, 0) == 10000.0  # 0: never
    inv_freq = 1.0 / (ref.rope_base(2048, 16, 10000.0, 1024) ** (np.arange(0, 16, 2, dtype=np.float32) / 16))
    np.testing.assert_allclose(inv_freq, [1.0, 0.28641495, 0.08203353, 0.023495633, 0.0067295013, 0.0019274298,
                                          0.00055204472, 0.00015811388], rtol=1e-6)  # the record's (SPEC 2.5)


def test_xsa_removes_each_heads_component_along_its_kv_groups_own_value():
    y, v = _normal(B, T, H, K), _normal(B, T, G, K)
    out = np.asarray(ref.xsa(y, v), np.float64)
    vn = np.asarray(v, np.float64) / np.linalg.norm(np.asarray(v, np.float64), axis=-1, keepdims=True)
    R = H // G
    for h in range(H):
        g = h // R  # consecutive query heads share a kv head (FA3's GQA mapping)
        _close(np.sum(out[:, :, h] * vn[:, :, g], axis=-1), np.zeros((B, T)), atol=1e-5)  # orthogonal to own v
        yh = np.asarray(y, np.float64)[:, :, h]
        _close(out[:, :, h], yh - np.sum(yh * vn[:, :, g], -1, keepdims=True) * vn[:, :, g])
        other = vn[:, :, (g + 1) % G]
        assert np.abs(np.sum(out[:, :, h] * other, -1)).max() > 1e-2  # not orthogonal to another group's v
    _close(ref.xsa(3.0 * jnp.repeat(v, R, axis=2), v), np.zeros((B, T, H, K)), atol=1e-5)  # y along v: nothing left
    _close(ref.xsa(y, jnp.zeros_like(v)), y)  # a zero value vector removes nothing (norm floor 1e-12)


def test_leaky_relu_squared_mlp_with_slope_0_is_relu_squared_bit_for_bit():
    x, w_fc, w_proj = _normal(6, D), _normal(D, F, scale=0.3), _normal(F, D, scale=0.3)
    h = jnp.maximum(x @ w_fc, 0)  # the baseline's expression
    np.testing.assert_array_equal(ref.mlp(x, w_fc, w_proj, 0.0), (h * h) @ w_proj)
    z = np.asarray(x @ w_fc, np.float64)
    a = np.where(z > 0, z, 0.5 * z)  # LeakyReLU(0.5): z^2 above 0, z^2 / 4 below
    _close(ref.mlp(x, w_fc, w_proj, 0.5), (a * a) @ np.asarray(w_proj, np.float64), rtol=1e-4, atol=1e-5)
    _close(ref.leaky_relu(jnp.asarray([-2.0, 0.0, 3.0]), 0.5), [-1.0, 0.0, 3.0])


def test_ln_scale_multiplies_the_normed_input_of_the_mlp():
    x, w_fc, w_proj = _normal(6, D), _normal(D, F, scale=0.3), _normal(F, D, scale=0.3)
    s = 1 / np.sqrt(3)
    xn = jnp.asarray(_naive_rms_norm(x) * s, jnp.float32)
    _close(ref.norm_mlp(x, w_fc, w_proj, 0.5, s), ref.mlp(xn, w_fc, w_proj, 0.5), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ref.ln_scaled(x, 1.0), x)


def _record_bigram_hash(ids, buckets):
    """The record's bigram_hash (train_gpt.py:695-700) written out: int32 products, XOR, mod (buckets - 1), the
    reserved bucket buckets - 1 at position 0."""
    t = np.asarray(ids, np.int64)
    out = np.empty_like(t)
    out[..., 0] = buckets - 1
    out[..., 1:] = np.bitwise_xor(36313 * t[..., 1:], 27191 * t[..., :-1]) % (buckets - 1)
    return out


def test_bigram_hash_is_the_records_formula_on_edge_tokens():
    # the harness's example (SPEC 2.7: the record's own function on these ids, 1536 buckets)
    ids = jnp.asarray([[1, 0, 1, 1023, 1023, 5, 1]], jnp.int32)
    np.testing.assert_array_equal(ref.bigram_hash(ids, 1536), [[1535, 1096, 1008, 660, 121, 30, 1337]])
    # position 0 of every row is the reserved bucket whatever its token; BOS (1), token 0, the largest id
    rows = jnp.asarray([[0, 0, 1023, 1, 0, 1023, 1023], [1023, 1, 1, 0, 1023, 0, 5], [5, 7, 0, 1, 2, 3, 4]], jnp.int32)
    for U in (2, 3, 1536, 2048):
        h = np.asarray(ref.bigram_hash(rows, U))
        np.testing.assert_array_equal(h, _record_bigram_hash(rows, U))
        assert np.all(h[:, 0] == U - 1) and np.all((0 <= h[:, 1:]) & (h[:, 1:] <= U - 2))  # pairs never reach U-1
    assert ref.bigram_hash(rows, 1536).dtype == jnp.int32
    big = jnp.asarray([[59137, 59137]], jnp.int32)  # the largest id whose int32 products do not overflow
    np.testing.assert_array_equal(ref.bigram_hash(big, 1536), _record_bigram_hash(big, 1536))


def test_smear_blends_each_position_with_its_predecessor_and_zero_at_each_row_start():
    x, gate = _normal(B, T, D), _normal(D)
    g = 1 / (1 + np.exp(-np.asarray(gate, np.float64)))
    x64 = np.asarray(x, np.float64)
    prev = np.concatenate([np.zeros_like(x64[:, :1]), x64[:, :-1]], axis=1)
    _close(ref.smear(x, gate), (1 - g) * x64 + g * prev)
    _close(ref.smear(x, jnp.zeros((D,))), 0.5 * x64 + 0.5 * prev)  # gate 0 at init: g = 0.5
    _close(ref.smear(x, gate)[:, 0], (1 - g) * x64[:, 0])  # every row starts with a zero predecessor


def test_fake_int6_is_the_records_late_qat_grid_with_a_straight_through_gradient():
    """reference.fake_int6 of a weight stored [in, out] is the record's CastedLinear QAT of its [out, in] transpose
    (train_gpt.py:541-553), written here in float64 from that definition: per output row scale = max(max |w| / 31,
    1 / 31), round half to even, clamp to [-32, 31]; rows below 1 in magnitude sit at the 1/31 floor, a row with a
    larger maximum is clamped at +31 (its -max maps to -31, -32 never occurs); the gradient is the identity."""
    w_OI = np.array([[0.5, -0.25, 1 / 62, 3 / 62], [2.0, -2.0, 1.0, 0.1], [-0.75, 0.3, 0.0, -1 / 31]])
    scale_O = np.maximum(np.abs(w_OI).max(axis=1) / 31, 1 / 31)
    want_OI = np.clip(np.round(w_OI / scale_O[:, None]), -32, 31) * scale_O[:, None]
    got_IO = ref.fake_int6(jnp.asarray(w_OI.T, jnp.float32), jnp.float32)
    _close(got_IO, want_OI.T, rtol=1e-6, atol=1e-7)
    assert np.round(1 / 62 * 31) == 0 and np.round(3 / 62 * 31) == 2  # ties to even (0.5 -> 0, 1.5 -> 2)
    levels = np.asarray(got_IO).T / scale_O[:, None]
    _close(levels, np.round(levels), atol=1e-4)  # every value on its row's grid
    grad = jax.grad(lambda w: jnp.sum(ref.fake_int6(w, jnp.float32) * jnp.arange(12.0).reshape(4, 3)))(
        jnp.asarray(w_OI.T, jnp.float32))
    _close(grad, np.arange(12.0).reshape(4, 3), rtol=0, atol=0)
