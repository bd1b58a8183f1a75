"""`frontier_jax.experimental.ops` is `frontier_jax.ops.experimental` (the kernel test files still import this
path)."""
