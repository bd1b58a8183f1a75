"""Contest rules as code, the part every run uses (no JAX): the rule profiles (`rules`), the code a run counts
(`codebytes`, recorded in its code.json) and the rules with a number (`limits`: size, time on the profile's
hardware, and what a run states about its profile at its end). The submission check that reviews a run
against a profile is `frontier_jax.submission`.
"""
