"""The pure policies both trainers share and the model and optimizers read: the dtype policy (which dtype
"auto" means on a platform) and the optimizer groups (which parameter Muon or Adam updates). Plain
functions of the config; no JAX, no driver, no run directory."""

from __future__ import annotations

from frontier_jax.config import ModelConfig, OptimConfig

def compute_dtype_name(cfg: ModelConfig, platform: str) -> str:
    """model.compute_dtype with "auto" resolved: bfloat16 matmuls on accelerators (the baseline), float32 on CPU."""
    if cfg.compute_dtype != "auto":
        return cfg.compute_dtype
    return "float32" if platform == "cpu" else "bfloat16"


def ns_dtype_name(cfg: OptimConfig, platform: str) -> str:
    """optim.muon_ns_dtype with "auto" resolved: bfloat16 on accelerators (the baseline), float32 on CPU."""
    if cfg.muon_ns_dtype != "auto":
        return cfg.muon_ns_dtype
    return "float32" if platform == "cpu" else "bfloat16"


# Block parameters that are vectors/scalars (Adam), even when 2-D (resid_mix): the baseline's
# CONTROL_TENSOR_NAME_PATTERNS.
CONTROL_PARAM_NAMES = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights", "ngram_bias")


def param_label(names: list[str], ndim: int) -> str:
    """The optimizer group of a parameter from its path names: "muon" (2-D matrices inside blocks),
    "embed" (tok_emb), "ngram" (the n-gram bias table) or "scalar" (everything else, Adam)."""
    if names and names[0] == "tok_emb":
        return "embed"
    if names and names[0] == "ngram_bias":
        return "ngram"
    if names and names[0] == "blocks" and ndim == 2 and not any(n in CONTROL_PARAM_NAMES for n in names):
        return "muon"
    return "scalar"
