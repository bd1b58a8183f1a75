"""The hot-path ops the model calls (and only through here).

PROVISIONAL: this first version forwards every op to `frontier_jax.reference`. The kernels work
(issue "NKI kernels part 1") replaces it with the dispatch layer: one primitive per op, custom_vjp,
a Neuron lowering to the NKI kernel, the kernel table and `--kernels {auto,reference,strict}`.
Keep these signatures.
"""

from __future__ import annotations

from frontier_jax import reference as ref

rms_norm = ref.rms_norm
rope = ref.rope
causal_attention = ref.causal_attention
mlp = ref.mlp
embed = ref.embed
head_loss = ref.head_loss
