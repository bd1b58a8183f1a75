"""python -m frontier_jax.compare: `frontier_jax.compare.arms`'s command line."""

import sys

from frontier_jax.compare.arms import main

sys.exit(main())
