"""The submission check: `python -m frontier_jax.submission check RUN [--rules NAME]` reviews a run against a
contest rule profile (frontier_jax.contest.rules) the way the Trainium contest's automated reviewer does, one
line per rule: pass / fail / not checkable / not applicable, each with its evidence (`check`). The pieces:
`envscan` (environment reads, an AST scan), `evidence` (the TTT log contract, the n-gram tables' record),
`forward` (one forward, causal, normalized: traced and run at the run's config). A module here may import the
run directory (`run`), the rules (`contest`) and the model's side (`model`, `optim`, `steps`, `ngram`,
`neuron`, `policies`, `data`); never a trainer, an entry point, the start-up, the checkpoint writer,
`compare` or the PyTorch baseline: it reviews a run and never trains one. docs/rules.md.
"""
