"""`python -m frontier_jax.kernel_report`: the trn1 step estimate from the traced program
(the command line of `frontier_jax.neuron.kernel_report`)."""

import sys

from frontier_jax.neuron.kernel_report import main

if __name__ == "__main__":
    sys.exit(main())
