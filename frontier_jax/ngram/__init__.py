"""N-gram logit bias: host tables (`tables`), the builder process (`builder`), the JAX bias (`bias`), analysis.

Importing the package loads nothing heavy; the builder's child process imports only numpy modules."""
