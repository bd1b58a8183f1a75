"""The pure rules both trainers follow, written once as plain functions of the config: the dtype policy
resolved once per run (`dtypes`), the optimizer groups (`groups`), the learning-rate and momentum schedules
(`schedules`), the step's split into micro-batches and its rows (`geometry`), the val score in bits per
byte (`scoring`) and the run's size before anything is built (`sizing`: the parameter count and the host-memory
guard). The JAX side (model, optimizer, trainer, evaluation, the Neuron check) and the PyTorch
baseline read them from here. A module here imports `frontier_jax.config` and `frontier_jax.errors` only:
no JAX, no torch, nothing else of frontier_jax."""
