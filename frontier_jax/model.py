"""The baseline transformer (docs/model.md) and the recipe's switches (docs/recipe.md) in Flax NNX.

Every hot op goes through `frontier_jax.ops` (kernel on Neuron, reference elsewhere); the recipe's embedding
stage (BigramHash, SmearGate, value embeddings) is small gathers, projections and elementwise ops from
`frontier_jax.ops.reference` that XLA runs on every platform. Attribute names follow the PyTorch baseline's
`state_dict` (and, for the recipe's parameters, the record's: `bigram.embed`, `smear.gate`, `ve_shared.proj`,
`ve_layer_scales.0`, ...) so interop is a renaming plus a transpose: linear weights are stored [in, out] here
(x_BTD @ w_DF) and [out, in] in PyTorch. Every switch's default is the baseline's behaviour, whose parameters,
initial values and random draws do not depend on the switches.

Axis letters: B batch, T sequence, D width, H query heads, G kv heads, K head dim, R rotated head dims, F MLP
hidden, V vocabulary, N = B*T, S sparse-bias sources, E BigramHash width, U BigramHash buckets, W
value-embedding width, O a projection's output width.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from frontier_jax import ops
from frontier_jax.ops import reference as ref
from frontier_jax.config import Config, ModelConfig

BIGRAM_SCALE_INIT = 0.05  # BigramHash's output scale at init (the record's)
VE_SCALE_INIT = 0.1  # the value embeddings' output scale at init (the record's)
VE_TABLE_INIT_STD = 0.01  # the value-embedding table's init std (the record's)
ORTHOGONAL_MIN_DIM = 64  # the record's init: a projection with both dims >= this is orthogonal, else zero
# the recipe's embedding-stage computations run as XLA ops under these names (jax.named_scope), by which the trn1
# step estimate prices them (frontier_jax.neuron.kernel_calls.glue)
BIGRAM_HASH, SMEAR_GATE, VALUE_EMBEDDING = "bigram_hash", "smear_gate", "value_embedding"
RECIPE_XLA_OPS = (BIGRAM_HASH, SMEAR_GATE, VALUE_EMBEDDING)


def _torch_linear_init(rngs: nnx.Rngs, fan_in: int, fan_out: int) -> jax.Array:
    """PyTorch nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), stored [in, out]."""
    bound = 1.0 / np.sqrt(fan_in)
    return jax.random.uniform(rngs.params(), (fan_in, fan_out), jnp.float32, -bound, bound)


def _record_rounded(x: jax.Array) -> jax.Array:
    """An initial value as the record holds it: rounded to bf16 (its whole model is cast to bf16 before the fp32
    parameters are restored), stored float32."""
    return x.astype(jnp.bfloat16).astype(jnp.float32)


def _linear_init(cfg: ModelConfig, rngs: nnx.Rngs, fan_in: int, fan_out: int) -> jax.Array:
    """A non-zero-init projection [in, out]: PyTorch's default (init "baseline"), or orthogonal (semi-orthogonal
    when not square) rounded to bf16 (init "record")."""
    if cfg.init == "baseline":
        return _torch_linear_init(rngs, fan_in, fan_out)
    return _record_rounded(jax.nn.initializers.orthogonal()(rngs.params(), (fan_in, fan_out), jnp.float32))


def _side_projection(cfg: ModelConfig, rngs: nnx.Rngs, fan_in: int, fan_out: int) -> jax.Array:
    """BigramHash's / the value embeddings' projection [in, out]: the record's init keeps its zero init unless both
    dims are >= 64 (then orthogonal); the baseline's init is PyTorch's default (a zero projection beside a zero
    BigramHash table would get no gradient)."""
    if cfg.init == "record" and min(fan_in, fan_out) < ORTHOGONAL_MIN_DIM:
        return jnp.zeros((fan_in, fan_out), jnp.float32)
    return _linear_init(cfg, rngs, fan_in, fan_out)


def _scale_init(cfg: ModelConfig, value: float) -> jax.Array:
    """A scalar scale's initial value: as written (init "baseline") or bf16-rounded (init "record")."""
    x = jnp.asarray(value, jnp.float32)
    return _record_rounded(x) if cfg.init == "record" else x


def _late_qat(w_IO: jax.Array, dt, qat) -> jax.Array:
    """A side projection's weight in dt as the record's CastedLinear uses it: fake-quantized to int6
    (`reference.fake_int6`, straight-through) where the traced flag `qat` is on (late QAT, a training forward);
    None (evaluation) or off: the weight itself."""
    if qat is None:
        return w_IO.astype(dt)
    return jnp.where(qat, ref.fake_int6(w_IO, dt), w_IO.astype(dt))


@functools.lru_cache(maxsize=16)
def _rope_tables(seq_len: int, rotary_dims: int, base: float):
    return ref.rope_tables(seq_len, rotary_dims, base)


class CausalSelfAttention(nnx.Module):
    """The attention's parameters (the baseline's names) and its core between the projections; the block's
    `attention_half` runs the projections, fused with the norm, the mix and the residual add."""

    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
        D, H, G, K = cfg.model_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim, self.rope_base = H, G, K, cfg.rope_base
        self.rotary_dims, self.rope_rescale_from = cfg.rotary_dims, cfg.rope_rescale_from
        self.xsa = layer in cfg.xsa_layers()
        self.c_q = nnx.Param(_linear_init(cfg, rngs, D, H * K))
        self.c_k = nnx.Param(_linear_init(cfg, rngs, D, G * K))
        self.c_v = nnx.Param(_linear_init(cfg, rngs, D, G * K))
        self.proj = nnx.Param(jnp.zeros((H * K, D), jnp.float32))  # zero-init output projection
        self.q_gain = nnx.Param(jnp.full((H,), cfg.qk_gain_init, jnp.float32))

    def __call__(self, q_BTO: jax.Array, k_BTO: jax.Array, v_BTO: jax.Array) -> jax.Array:
        """The attention between its projections: QK-norm, RoPE (on the first R dims of each head, its base
        rescaled for long sequences), rope(q) * q_gain, causal GQA attention and XSA on this layer, one op (q and
        k normed and rotated on chip); [B, T, H * K] out, before `proj`."""
        B, T, _ = q_BTO.shape
        H, G, K = self.num_heads, self.num_kv_heads, self.head_dim
        q_BTHK, k_BTGK, v_BTGK = q_BTO.reshape(B, T, H, K), k_BTO.reshape(B, T, G, K), v_BTO.reshape(B, T, G, K)
        base = ref.rope_base(T, self.rotary_dims, self.rope_base, self.rope_rescale_from)
        cos_TR2, sin_TR2 = _rope_tables(T, self.rotary_dims, base)
        o_BTHK = ops.qk_attention(q_BTHK, k_BTGK, v_BTGK, cos_TR2, sin_TR2, self.q_gain[...], xsa=self.xsa)
        return o_BTHK.reshape(B, T, H * K)


class MLP(nnx.Module):
    """act(x fc)^2 proj's weights (the baseline's names), act = LeakyReLU(negative slope) (0: relu); the block's
    `mlp_half` runs it as one fused op."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, F = cfg.model_dim, cfg.mlp_hidden
        self.fc = nnx.Param(_linear_init(cfg, rngs, D, F))
        self.proj = nnx.Param(jnp.zeros((F, D), jnp.float32))  # zero-init output projection


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
        D = cfg.model_dim
        self.ln_scale = cfg.layer_ln_scale(layer)  # a constant of the layer, not a parameter
        self.negative_slope = cfg.mlp_negative_slope
        self.attn = CausalSelfAttention(cfg, layer, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)
        self.attn_scale = nnx.Param(jnp.ones((D,), jnp.float32))
        self.mlp_scale = nnx.Param(jnp.ones((D,), jnp.float32))
        self.resid_mix = nnx.Param(jnp.stack([jnp.ones((D,)), jnp.zeros((D,))]).astype(jnp.float32))

    def __call__(self, x_BTD: jax.Array, x0_BTD: jax.Array, skip_BTD=None, skip_w_D=None, ve_BTO=None) -> jax.Array:
        """The baseline's block: x = mix[0] * x + mix[1] * x0 (a decoder block adds its U-Net skip to x
        first), x = x + attn_scale * attn(rms_norm(x) * s), x = x + mlp_scale * mlp(rms_norm(x) * s) with s this
        layer's LN-scale factor (1 without ln_scale); ve_BTO (a value-embedding layer's) is added to v before
        attention. Each half is fused ops (the norms, the mix and the scaled residual adds run inside the
        kernels)."""
        x_BTD = self.attention_half(x_BTD, x0_BTD, skip_BTD, skip_w_D, ve_BTO)
        x_BTD = self.mlp_half(x_BTD)
        return x_BTD

    def attention_half(self, x_BTD, x0_BTD, skip_BTD=None, skip_w_D=None, ve_BTO=None) -> jax.Array:
        """x + attn_scale * attn(rms_norm(x) * s) with x = resid_mix of (x [+ skip_w * skip], x0): the mix and
        the norm fused into the q/k/v projection, the scaled residual add into the output projection."""
        attn = self.attn
        x_BTD, q_BTO, k_BTO, v_BTO = ops.mix_norm_qkv_projection(
            x_BTD, x0_BTD, self.resid_mix[...], attn.c_q[...], attn.c_k[...], attn.c_v[...], skip_BTD, skip_w_D,
            ln_scale=self.ln_scale)
        if ve_BTO is not None:
            with jax.named_scope(VALUE_EMBEDDING):
                v_BTO = v_BTO + ve_BTO.astype(v_BTO.dtype)
        return ops.out_projection(attn(q_BTO, k_BTO, v_BTO), attn.proj[...], x_BTD, self.attn_scale[...])

    def mlp_half(self, x_BTD: jax.Array) -> jax.Array:
        """x + mlp_scale * mlp(rms_norm(x) * s): the norm, the MLP and the scaled residual add, one op."""
        return ops.norm_mlp(x_BTD, self.mlp.fc[...], self.mlp.proj[...], self.mlp_scale[...],
                            negative_slope=self.negative_slope, ln_scale=self.ln_scale)


class BigramHash(nnx.Module):
    """The record's BigramHashEmbedding: embed[hash(ids[t-1], ids[t])] projected to D (when E != D) times `scale`,
    added to the token embedding (reference.bigram_hash: the record's hash and its reserved position-0 bucket)."""

    def __init__(self, cfg: ModelConfig, embed_dtype, *, rngs: nnx.Rngs):
        U, E, D = cfg.bigram_buckets, cfg.bigram_dim, cfg.model_dim
        self.buckets = U
        self.embed = nnx.Param(jnp.zeros((U, E), embed_dtype))  # zero at init (both inits)
        self.proj = nnx.Param(_side_projection(cfg, rngs, E, D)) if E != D else None
        self.scale = nnx.Param(_scale_init(cfg, BIGRAM_SCALE_INIT))

    def __call__(self, ids_BT: jax.Array, dt, qat=None) -> jax.Array:
        proj = None if self.proj is None else _late_qat(self.proj[...], dt, qat)
        return ref.scaled_table_projection(ref.bigram_hash(ids_BT, self.buckets), self.embed[...], proj,
                                           self.scale[...], dt)


class SmearGate(nnx.Module):
    """(1 - g) x_t + g x_(t-1) per channel, g = sigmoid(gate), gate zero at init (g = 0.5)."""

    def __init__(self, cfg: ModelConfig):
        self.gate = nnx.Param(jnp.zeros((cfg.model_dim,), jnp.float32))


class ValueEmbedding(nnx.Module):
    """The record's shared value embedding: (embed[ids] proj) * scale, [B, T, G * K], once per forward; each
    listed layer adds it times its own `ve_layer_scales` entry to v."""

    def __init__(self, cfg: ModelConfig, embed_dtype, *, rngs: nnx.Rngs):
        V, W, O = cfg.vocab_size, cfg.ve_dim, cfg.num_kv_heads * cfg.head_dim
        table = VE_TABLE_INIT_STD * jax.random.normal(rngs.params(), (V, W), jnp.float32)
        self.embed = nnx.Param((_record_rounded(table) if cfg.init == "record" else table).astype(embed_dtype))
        self.proj = nnx.Param(_side_projection(cfg, rngs, W, O)) if W != O else None
        self.scale = nnx.Param(_scale_init(cfg, VE_SCALE_INIT))

    def __call__(self, ids_BT: jax.Array, dt, qat=None) -> jax.Array:
        proj = None if self.proj is None else _late_qat(self.proj[...], dt, qat)
        return ref.scaled_table_projection(ids_BT, self.embed[...], proj, self.scale[...], dt)


class GPT(nnx.Module):
    """Returns per-token cross-entropy (nats, float32, [B, T]); training and evaluation both call this."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype, num_bias_orders: int = 0,
                 bias_buckets: int = 0):
        self.cfg = cfg
        self.compute_dtype = jnp.dtype(compute_dtype)  # the run's resolved policy (frontier_jax.policies.dtypes)
        # the tables' storage dtype: the compute dtype (the baseline's rule) unless model.embed_dtype names one
        embed_dtype = self.compute_dtype if cfg.embed_dtype == "compute" else jnp.dtype(cfg.embed_dtype)
        V, D = cfg.vocab_size, cfg.model_dim
        # The baseline stores the tied embedding in the compute dtype (bf16 on accelerators).
        emb = cfg.tied_embed_init_std * jax.random.normal(rngs.params(), (V, D), jnp.float32)
        self.tok_emb = nnx.Param(emb.astype(embed_dtype))
        self.num_encoder_layers = cfg.num_layers // 2
        self.num_decoder_layers = cfg.num_layers - self.num_encoder_layers
        num_skips = min(self.num_encoder_layers, self.num_decoder_layers)
        self.skip_weights = nnx.Param(jnp.ones((num_skips, D), jnp.float32))
        self.blocks = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.num_layers)])
        # the recipe's parameters (drawn after the baseline's, so that those do not depend on the switches)
        self.bigram = BigramHash(cfg, embed_dtype, rngs=rngs) if cfg.bigram_buckets else None
        self.smear = SmearGate(cfg) if cfg.smear_gate else None
        self.ve_shared = ValueEmbedding(cfg, embed_dtype, rngs=rngs) if cfg.ve_layers else None
        self.ve_layer_scales = nnx.List([nnx.Param(jnp.ones((1,), jnp.float32)) for _ in cfg.ve_layers])
        if num_bias_orders:
            # n-gram logit bias: one learned value per (order, confidence bucket), zero at init.
            self.ngram_bias = nnx.Param(jnp.zeros((num_bias_orders, bias_buckets), jnp.float32))

    def embed(self, inputs_BT: jax.Array, qat=None) -> jax.Array:
        """x0 [B, T, D] in the compute dtype: rms_norm(tok_emb[ids] (+ BigramHash)), then SmearGate."""
        dt = self.compute_dtype
        x_BTD = ops.embed(inputs_BT, self.tok_emb[...]).astype(dt)
        if self.bigram is not None:
            with jax.named_scope(BIGRAM_HASH):
                x_BTD = x_BTD + self.bigram(inputs_BT, dt, qat)
        x_BTD = ops.rms_norm(x_BTD)
        if self.smear is not None:
            with jax.named_scope(SMEAR_GATE):
                x_BTD = ref.smear(x_BTD, self.smear.gate[...])
        return x_BTD

    def hidden(self, inputs_BT: jax.Array, qat=None) -> jax.Array:
        """Final-normed hidden states [B, T, D] in the compute dtype (`qat`: the late-QAT flag, `__call__`)."""
        x_BTD = x0_BTD = self.embed(inputs_BT, qat)
        with jax.named_scope(VALUE_EMBEDDING):
            ve_BTO = None if self.ve_shared is None else self.ve_shared(inputs_BT, self.compute_dtype, qat)
        ve_index = {layer: k for k, layer in enumerate(self.cfg.ve_layers)}

        def ve(layer):  # the shared value embedding times the layer's scale, on the listed layers
            k = ve_index.get(layer)
            if k is None:
                return None
            with jax.named_scope(VALUE_EMBEDDING):
                return ve_BTO * self.ve_layer_scales[k][...].astype(ve_BTO.dtype)

        skips = []
        for i in range(self.num_encoder_layers):
            x_BTD = self.blocks[i](x_BTD, x0_BTD, ve_BTO=ve(i))
            skips.append(x_BTD)
        for i in range(self.num_decoder_layers):
            b = self.num_encoder_layers + i
            skip = (skips.pop(), self.skip_weights[i]) if skips else (None, None)  # the skip add runs in the block
            x_BTD = self.blocks[b](x_BTD, x0_BTD, *skip, ve_BTO=ve(b))
        return ops.rms_norm(x_BTD)

    def __call__(self, inputs_BT: jax.Array, targets_BT: jax.Array, bias_ids_BTS=None, bias_vals_BTS=None, *,
                 qat=None):
        """Per-token losses; `qat` (a traced bool, training forwards of a run with late QAT): BigramHash's and the
        value embeddings' projections fake-quantized to int6 where it is on (the record's CastedLinear layers);
        None: never (evaluation)."""
        B, T = inputs_BT.shape
        x_ND = self.hidden(inputs_BT, qat).reshape(B * T, self.cfg.model_dim)
        if bias_ids_BTS is not None:
            S = bias_ids_BTS.shape[-1]
            bias_ids_BTS, bias_vals_BTS = bias_ids_BTS.reshape(B * T, S), bias_vals_BTS.reshape(B * T, S)
        loss_N = ops.head_loss(x_ND, self.tok_emb[...], targets_BT.reshape(B * T), self.cfg.logit_softcap,
                               bias_ids_BTS, bias_vals_BTS)
        return loss_N.reshape(B, T)


def build(cfg: Config, compute_dtype) -> GPT:
    """The model of a run: `cfg.model` in `compute_dtype` (the run's `policies.dtypes.resolve(...).compute`), seeded by
    `cfg.train.seed`, with the n-gram bias parameter when `cfg.ngram.enabled`. Wrap it in
    `nnx.eval_shape(lambda: build(cfg, dtype))` for the abstract model (restoring a checkpoint)."""
    ng = cfg.ngram
    return GPT(cfg.model, rngs=nnx.Rngs(cfg.train.seed), compute_dtype=compute_dtype,
               num_bias_orders=ng.bias_orders, bias_buckets=ng.confidence_buckets)


def count_params(model: nnx.Module) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
