"""frontier_jax: a JAX trainer of small language models for AWS Trainium, scored in exact bits per byte. The top
level holds the entry points (train, evaluate), the JAX trainer, the model, the optimizer, the steps, the mesh
and the checkpoints; the rest lives in rooms by concern (data, policies, run, ops, interop, ngram, neuron,
compare), each of whose __init__ says what it holds and may import (README.md, Layout; pyproject.toml's
import contracts). A regular package, so that one checkout's modules never mix with another's."""
