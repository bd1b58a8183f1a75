"""What a run is, for both trainers: the budgeted-run driver (`driver`), how a run stops and ends (`endings`),
the trainer interface the two trainers implement (`interface`), the start-up lifecycle (`startup`),
progress lines (`progress`), the run directory and its files (`rundir`, `curves`), the final evaluation
pipeline (`final`), the artifact's summary entries and score lines (`roundtrip`; the code bytes it adds are
`frontier_jax.contest.codebytes`), run resolution from the command line (`resolve`) and the process tuning before
a framework starts (`host`). The JAX trainer (`frontier_jax.trainer`) and the PyTorch baseline
(`baseline_torch.train`) both run on these. A module here imports no JAX, flax, optax, orbax or torch, and of
frontier_jax only `config`, `errors`, `data`, `policies` and `contest`."""
