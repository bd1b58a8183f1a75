"""`frontier_jax.dispatch` is `frontier_jax.ops.dispatch` (the kernel test files still import this path)."""

import sys

from frontier_jax.ops import dispatch

sys.modules[__name__] = dispatch
