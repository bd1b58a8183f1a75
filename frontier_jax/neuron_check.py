"""`python -m frontier_jax.neuron_check`: the trainer's programs checked against AWS's documented JAX limits
(the command line of `frontier_jax.neuron.check`)."""

import sys

from frontier_jax.neuron.check import main

if __name__ == "__main__":
    sys.exit(main())
