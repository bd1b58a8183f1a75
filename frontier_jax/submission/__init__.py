"""The submission check: `python -m frontier_jax.submission check RUN [--rules NAME]` reviews a run against a
contest rule profile (frontier_jax.contest.rules) the way the Trainium contest's automated reviewer does, one
line per rule: pass / fail / not checkable / not applicable, each with its evidence (`check`). The pieces:
`envscan` (environment reads, an AST scan), `evidence` (the TTT log contract, the n-gram tables' record),
`forward` (one forward, causal, normalized: traced and run at the run's config). docs/rules.md.
"""
