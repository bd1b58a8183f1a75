"""`frontier_jax.reference` is `frontier_jax.ops.reference` (the kernel test files still import this path)."""

import sys

from frontier_jax.ops import reference

sys.modules[__name__] = reference
