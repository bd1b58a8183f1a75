"""`frontier_jax.experimental.ops` is `frontier_jax.ops.experimental` (the kernel test files still import this
path)."""

import sys

from frontier_jax.ops import experimental

sys.modules[__name__] = experimental
