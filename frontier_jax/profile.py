"""`python -m frontier_jax.profile`: timelines of kernel calls on one NeuronCore's engines
(the command line of `frontier_jax.neuron.profile`)."""

import sys

from frontier_jax.neuron.profile import main

if __name__ == "__main__":
    sys.exit(main())
