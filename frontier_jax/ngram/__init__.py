"""N-gram logit bias: the hash (`hashing`), host tables (`tables`), the builder process (`builder`), the tables it
publishes (`snapshot`), the JAX bias (`bias`), the trainer's runtime as a run hook (`runtime`), the network's
score beside the tables' (`network_eval`) and the analysis command line (`analyze`, `python -m
frontier_jax.ngram.analyze`). Importing the package loads nothing heavy; the builder's child process imports
only numpy modules. A module here may import the ground (`config`, `errors`, `data`), the run interface and
directory (`run`) and a run's weights (`interop`); never `neuron`, `compare`, the trainer or an entry point."""
