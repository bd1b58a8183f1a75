"""The trainer's programs as trn1 would run them: the steps traced with the kernel calls in place
(`program`), their peak memory per device against what a device has, a NeuronCore's HBM or the host's RAM
(`memory`: the trainer's check before anything is allocated, and the micro-batch that fits), checked against
AWS's documented JAX limits (`check`, `python -m frontier_jax.neuron_check`),
their kernel calls and the work between them (`kernel_calls`), the trn1 step estimate
(`kernel_report`, `python -m frontier_jax.kernel_report`) and timelines of the calls on the engines
(`profile`, `python -m frontier_jax.profile`). A module here may import the model's side (`ops`, `model`,
`optim`, `steps`, `parallel`, `ngram`, `policies`, `data`, `config`, `errors`); never the run's machinery
(`run`, `trainer`), `interop`, `compare` or an entry point; the JAX trainer imports `check`, `program` and `memory`."""
