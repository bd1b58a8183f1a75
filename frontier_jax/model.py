"""The baseline transformer (docs/model.md) in Flax NNX.

Every hot op goes through `frontier_jax.ops` (kernel on Neuron, reference elsewhere). Attribute
names follow the PyTorch baseline's `state_dict` so interop is a renaming plus a transpose:
linear weights are stored [in, out] here (x_BTD @ w_DF) and [out, in] in PyTorch.

Axis letters: B batch, T sequence, D width, H query heads, G kv heads, K head dim, F MLP hidden,
V vocabulary, N = B*T, S sparse-bias sources.
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


def _torch_linear_init(rngs: nnx.Rngs, fan_in: int, fan_out: int) -> jax.Array:
    """PyTorch nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), stored [in, out]."""
    bound = 1.0 / np.sqrt(fan_in)
    return jax.random.uniform(rngs.params(), (fan_in, fan_out), jnp.float32, -bound, bound)


@functools.lru_cache(maxsize=16)
def _rope_tables(seq_len: int, head_dim: int, base: float):
    return ref.rope_tables(seq_len, head_dim, base)


class CausalSelfAttention(nnx.Module):
    """The attention's parameters (the baseline's names) and its core between the projections; the block's
    `attention_half` runs the projections, fused with the norm, the mix and the residual add."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, H, G, K = cfg.model_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim, self.rope_base = H, G, K, cfg.rope_base
        self.c_q = nnx.Param(_torch_linear_init(rngs, D, H * K))
        self.c_k = nnx.Param(_torch_linear_init(rngs, D, G * K))
        self.c_v = nnx.Param(_torch_linear_init(rngs, D, G * K))
        self.proj = nnx.Param(jnp.zeros((H * K, D), jnp.float32))  # zero-init output projection
        self.q_gain = nnx.Param(jnp.full((H,), cfg.qk_gain_init, jnp.float32))

    def __call__(self, q_BTO: jax.Array, k_BTO: jax.Array, v_BTO: jax.Array) -> jax.Array:
        """The attention between its projections: QK-norm, RoPE, rope(q) * q_gain and causal GQA attention,
        one op (q and k normed and rotated on chip); [B, T, H * K] out, before `proj`."""
        B, T, _ = q_BTO.shape
        H, G, K = self.num_heads, self.num_kv_heads, self.head_dim
        q_BTHK, k_BTGK, v_BTGK = q_BTO.reshape(B, T, H, K), k_BTO.reshape(B, T, G, K), v_BTO.reshape(B, T, G, K)
        cos_TK2, sin_TK2 = _rope_tables(T, K, self.rope_base)
        o_BTHK = ops.qk_attention(q_BTHK, k_BTGK, v_BTGK, cos_TK2, sin_TK2, self.q_gain[...])
        return o_BTHK.reshape(B, T, H * K)


class MLP(nnx.Module):
    """relu(x fc)^2 proj's weights (the baseline's names); the block's `mlp_half` runs it as one fused op."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, F = cfg.model_dim, cfg.mlp_mult * cfg.model_dim
        self.fc = nnx.Param(_torch_linear_init(rngs, D, F))
        self.proj = nnx.Param(jnp.zeros((F, D), jnp.float32))  # zero-init output projection


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D = cfg.model_dim
        self.attn = CausalSelfAttention(cfg, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)
        self.attn_scale = nnx.Param(jnp.ones((D,), jnp.float32))
        self.mlp_scale = nnx.Param(jnp.ones((D,), jnp.float32))
        self.resid_mix = nnx.Param(jnp.stack([jnp.ones((D,)), jnp.zeros((D,))]).astype(jnp.float32))

    def __call__(self, x_BTD: jax.Array, x0_BTD: jax.Array, skip_BTD=None, skip_w_D=None) -> jax.Array:
        """The baseline's block: x = mix[0] * x + mix[1] * x0 (a decoder block adds its U-Net skip to x
        first), x = x + attn_scale * attn(rms_norm(x)), x = x + mlp_scale * mlp(rms_norm(x)); each half is
        fused ops (the norms, the mix and the scaled residual adds run inside the kernels)."""
        x_BTD = self.attention_half(x_BTD, x0_BTD, skip_BTD, skip_w_D)
        x_BTD = self.mlp_half(x_BTD)
        return x_BTD

    def attention_half(self, x_BTD, x0_BTD, skip_BTD=None, skip_w_D=None) -> jax.Array:
        """x + attn_scale * attn(rms_norm(x)) with x = resid_mix of (x [+ skip_w * skip], x0): the mix and
        the norm fused into the q/k/v projection, the scaled residual add into the output projection."""
        attn = self.attn
        x_BTD, q_BTO, k_BTO, v_BTO = ops.mix_norm_qkv_projection(
            x_BTD, x0_BTD, self.resid_mix[...], attn.c_q[...], attn.c_k[...], attn.c_v[...], skip_BTD, skip_w_D)
        return ops.out_projection(attn(q_BTO, k_BTO, v_BTO), attn.proj[...], x_BTD, self.attn_scale[...])

    def mlp_half(self, x_BTD: jax.Array) -> jax.Array:
        """x + mlp_scale * mlp(rms_norm(x)): the norm, the MLP and the scaled residual add, one op."""
        return ops.norm_mlp(x_BTD, self.mlp.fc[...], self.mlp.proj[...], self.mlp_scale[...])


class GPT(nnx.Module):
    """Returns per-token cross-entropy (nats, float32, [B, T]); training and evaluation both call this."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, compute_dtype, num_bias_orders: int = 0,
                 bias_buckets: int = 0):
        self.cfg = cfg
        self.compute_dtype = jnp.dtype(compute_dtype)  # the run's resolved policy (frontier_jax.policies.dtypes)
        V, D = cfg.vocab_size, cfg.model_dim
        # The baseline stores the tied embedding in the compute dtype (bf16 on accelerators).
        emb = cfg.tied_embed_init_std * jax.random.normal(rngs.params(), (V, D), jnp.float32)
        self.tok_emb = nnx.Param(emb.astype(self.compute_dtype))
        self.num_encoder_layers = cfg.num_layers // 2
        self.num_decoder_layers = cfg.num_layers - self.num_encoder_layers
        num_skips = min(self.num_encoder_layers, self.num_decoder_layers)
        self.skip_weights = nnx.Param(jnp.ones((num_skips, D), jnp.float32))
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        if num_bias_orders:
            # n-gram logit bias: one learned value per (order, confidence bucket), zero at init.
            self.ngram_bias = nnx.Param(jnp.zeros((num_bias_orders, bias_buckets), jnp.float32))

    def hidden(self, inputs_BT: jax.Array) -> jax.Array:
        """Final-normed hidden states [B, T, D] in the compute dtype."""
        x_BTD = ops.embed(inputs_BT, self.tok_emb[...]).astype(self.compute_dtype)
        x_BTD = ops.rms_norm(x_BTD)
        x0_BTD = x_BTD
        skips = []
        for i in range(self.num_encoder_layers):
            x_BTD = self.blocks[i](x_BTD, x0_BTD)
            skips.append(x_BTD)
        for i in range(self.num_decoder_layers):
            skip = (skips.pop(), self.skip_weights[i]) if skips else ()  # the skip add runs inside the block
            x_BTD = self.blocks[self.num_encoder_layers + i](x_BTD, x0_BTD, *skip)
        return ops.rms_norm(x_BTD)

    def __call__(self, inputs_BT: jax.Array, targets_BT: jax.Array, bias_ids_BTS=None, bias_vals_BTS=None):
        B, T = inputs_BT.shape
        x_ND = self.hidden(inputs_BT).reshape(B * T, self.cfg.model_dim)
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
