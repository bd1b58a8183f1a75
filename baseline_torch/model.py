"""The parameter-golf baseline GPT in PyTorch (docs/model.md).

Parameter names are the baseline's `state_dict` names, which are also the keys of the interop `.npz`
(`tok_emb.weight`, `blocks.{i}.attn.c_q.weight` [out, in], ...). Linear weights stay float32 and are
cast to the activation dtype at the matmul (CastedLinear); the tied embedding is stored in the compute
dtype (bf16 on accelerators, as the baseline's `model.bfloat16()` followed by restoring linears and
control tensors to float32). `forward` returns per-token cross-entropy in float32 [B, T], like the
JAX model; training takes its mean.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from frontier_jax.config import ConfigError
from frontier_jax.interop import npz

# The JAX reference passes float32 eps explicitly; PyTorch's default for fp32/bf16 inputs is the same.
RMS_EPS = torch.finfo(torch.float32).eps


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),), eps=RMS_EPS)


def refuse_recipe(mc, oc=None) -> None:
    """This port is the baseline's: a model config with the recipe's switches (docs/recipe.md) on, or an optimizer
    config `oc` with the record's settings (weight decay, clipping, bf16 momentum, averaging, late QAT), is refused
    in one line (the PyTorch side of a recipe comparison is the record's own script)."""
    switches = mc.recipe_switches() + (oc.recipe_settings() if oc is not None else [])
    if switches:
        raise ConfigError(f"baseline_torch implements the baseline only; this config sets {', '.join(switches)} "
                          "(the PyTorch side of a recipe comparison is the record's own train_gpt.py)")


class CastedLinear(nn.Linear):
    """nn.Linear without bias whose float32 weight is cast to the input dtype at use."""

    def __init__(self, fan_in: int, fan_out: int, zero_init: bool = False):
        super().__init__(fan_in, fan_out, bias=False)
        self.zero_init = zero_init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class Rotary(nn.Module):
    def __init__(self, head_dim: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, seq_len: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.arange(seq_len, device=device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq.to(device))
        return freqs.cos()[None, None].to(dtype), freqs.sin()[None, None].to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotation: (x1 cos + x2 sin, -x1 sin + x2 cos)."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, mc):
        super().__init__()
        D, H, G, K = mc.model_dim, mc.num_heads, mc.num_kv_heads, mc.model_dim // mc.num_heads
        self.num_heads, self.num_kv_heads, self.head_dim = H, G, K
        self.c_q = CastedLinear(D, H * K)
        self.c_k = CastedLinear(D, G * K)
        self.c_v = CastedLinear(D, G * K)
        self.proj = CastedLinear(H * K, D, zero_init=True)
        self.q_gain = nn.Parameter(torch.full((H,), mc.qk_gain_init, dtype=torch.float32))
        self.rotary = Rotary(K, mc.rope_base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        H, G, K = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.c_q(x).reshape(B, T, H, K).transpose(1, 2)
        k = self.c_k(x).reshape(B, T, G, K).transpose(1, 2)
        v = self.c_v(x).reshape(B, T, G, K).transpose(1, 2)
        q, k = rms_norm(q), rms_norm(k)  # QK-norm
        cos, sin = self.rotary(T, x.device, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q = q * self.q_gain.to(q.dtype)[None, :, None, None]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=G != H)
        return self.proj(y.transpose(1, 2).reshape(B, T, H * K))


class MLP(nn.Module):
    def __init__(self, mc):
        super().__init__()
        hidden = mc.mlp_hidden
        self.fc = CastedLinear(mc.model_dim, hidden)
        self.proj = CastedLinear(hidden, mc.model_dim, zero_init=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self, mc):
        super().__init__()
        D = mc.model_dim
        self.attn = CausalSelfAttention(mc)
        self.mlp = MLP(mc)
        self.attn_scale = nn.Parameter(torch.ones(D, dtype=torch.float32))
        self.mlp_scale = nn.Parameter(torch.ones(D, dtype=torch.float32))
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(D), torch.zeros(D))).float())

    def forward(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        mix = self.resid_mix.to(x.dtype)
        x = mix[0][None, None, :] * x + mix[1][None, None, :] * x0
        x = x + self.attn_scale.to(x.dtype)[None, None, :] * self.attn(rms_norm(x))
        x = x + self.mlp_scale.to(x.dtype)[None, None, :] * self.mlp(rms_norm(x))
        return x


class GPT(nn.Module):
    def __init__(self, mc, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        refuse_recipe(mc)
        self.mc = mc
        self.compute_dtype = compute_dtype
        self.tok_emb = nn.Embedding(mc.vocab_size, mc.model_dim)
        self.num_encoder_layers = mc.num_layers // 2
        self.num_decoder_layers = mc.num_layers - self.num_encoder_layers
        num_skips = min(self.num_encoder_layers, self.num_decoder_layers)
        self.skip_weights = nn.Parameter(torch.ones(num_skips, mc.model_dim, dtype=torch.float32))
        self.blocks = nn.ModuleList([Block(mc) for _ in range(mc.num_layers)])
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=mc.tied_embed_init_std)
        for m in self.modules():
            if isinstance(m, CastedLinear) and m.zero_init:
                nn.init.zeros_(m.weight)
        self.tok_emb.weight.data = self.tok_emb.weight.data.to(compute_dtype)

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = rms_norm(self.tok_emb(input_ids))
        x0 = x
        skips = []
        for i in range(self.num_encoder_layers):
            x = self.blocks[i](x, x0)
            skips.append(x)
        for i in range(self.num_decoder_layers):
            if skips:
                x = x + self.skip_weights[i].to(x.dtype)[None, None, :] * skips.pop()
            x = self.blocks[self.num_encoder_layers + i](x, x0)
        return rms_norm(x)

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Softcapped tied logits [B, T, V] as float32."""
        x = self.hidden(input_ids)
        z = F.linear(x, self.tok_emb.weight.to(x.dtype))
        cap = self.mc.logit_softcap
        return (cap * torch.tanh(z / cap)).float()

    def forward(self, input_ids: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
        logits = self.logits(input_ids)
        B, T, V = logits.shape
        loss = F.cross_entropy(logits.reshape(B * T, V), target_ids.reshape(B * T).long(), reduction="none")
        return loss.reshape(B, T)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- interop .npz


def state_dict_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """Parameters as numpy arrays keyed by state_dict name, each in its own dtype (bf16 via ml_dtypes)."""
    import ml_dtypes

    out = {}
    for k, v in model.state_dict().items():
        a = v.detach().cpu().to(torch.float32).numpy()  # to the host first: no device graph for the cast
        out[k] = a.astype(ml_dtypes.bfloat16) if v.dtype == torch.bfloat16 else a
    return out


def save_npz(model: nn.Module, path, meta: dict | None = None) -> Path:
    """Write the interop .npz (frontier_jax.interop.npz.save_npz: float32 arrays + __dtypes__/__meta__)."""
    npz.save_npz(path, state_dict_numpy(model), meta)
    return Path(path)


def load_state_numpy(model: nn.Module, arrays: dict[str, np.ndarray], where: str = "<weights>") -> None:
    """Copy numpy arrays into the model (each cast to the parameter's dtype); names and shapes must match.
    Keys starting with "__" are metadata and ignored."""
    own = model.state_dict()
    npz.check_weights(arrays, {k: tuple(t.shape) for k, t in own.items()}, where)  # as `interop import` checks
    with torch.no_grad():
        for k, t in own.items():
            a = np.asarray(arrays[k])
            t.copy_(torch.from_numpy(np.ascontiguousarray(a.astype(np.float32))).to(t.dtype))


def load_npz(model: nn.Module, path) -> None:
    sd, _ = npz.load_npz(path)
    load_state_numpy(model, sd, str(path))
