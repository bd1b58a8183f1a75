"""Contest rules as code, the part every run uses: the rule profiles (`rules`), the code a run counts
(`codebytes`, recorded in its code.json) and the rules with a number (`limits`: size, time on the profile's
hardware, and what a run states about its profile at its end). A module here imports of frontier_jax only
`config` and `errors`, and no JAX, flax, optax, orbax or torch: the run machinery of both trainers (`run`)
imports it. The submission check that reviews a run against a profile is `frontier_jax.submission`.
"""
