"""python -m frontier_jax.interop: `frontier_jax.interop.state_dict`'s command line (export, import)."""

import sys

from frontier_jax.interop.state_dict import main

sys.exit(main())
