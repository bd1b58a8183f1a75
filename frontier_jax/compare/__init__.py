"""`python -m frontier_jax.compare`: is B better than A, and is the difference real? The arms run
interleaved as subprocesses (`arms`), what one run produced read back from its output (`collect`), the
statistics and verdicts (`stats`) and the markdown table and plot (`report`). A module here imports
`frontier_jax.config`, `frontier_jax.errors` and `frontier_jax.data` only: the trainers run as separate
processes, never in this one; no JAX."""
