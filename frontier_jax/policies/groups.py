"""The optimizer groups both trainers and the JAX optimizer read: which parameter Muon updates and which
Adam (at which learning rate), from its path names. A plain function of the names; no JAX."""

from __future__ import annotations

# Block parameters that are vectors/scalars (Adam), even when 2-D (resid_mix): the baseline's
# CONTROL_TENSOR_NAME_PATTERNS.
CONTROL_PARAM_NAMES = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights", "ngram_bias")
# The recipe's tables beside tok_emb: the record trains them with the tied embedding's Adam and learning rate
# (its optimizer_tok, train_gpt.py:1530-1536); their projections and scales are in its scalar group (1546-1552).
EMBED_TABLES = (("bigram", "embed"), ("ve_shared", "embed"))


def param_label(names: list[str], ndim: int) -> str:
    """The optimizer group of a parameter from its path names: "muon" (2-D matrices inside blocks),
    "embed" (tok_emb and the recipe's BigramHash and value-embedding tables), "ngram" (the n-gram bias table)
    or "scalar" (everything else, Adam: the blocks' control tensors, skip weights, and the recipe's
    projections, scales and gates)."""
    if names and (names[0] == "tok_emb" or tuple(names[:2]) in EMBED_TABLES):
        return "embed"
    if names and names[0] == "ngram_bias":
        return "ngram"
    if names and names[0] == "blocks" and ndim == 2 and not any(n in CONTROL_PARAM_NAMES for n in names):
        return "muon"
    return "scalar"
