"""Old names of the fused optimizer updates, kept only for callers outside this change
(tests/test_kernels_adam.py, tests/test_kernels_muon.py). The updates are declared in
`frontier_jax.ops`, their references are `frontier_jax.reference.adam_update` / `muon_update`, and the
fused transformations live in `frontier_jax.optim`. Delete this module once those tests import from there.
"""

from frontier_jax.ops import adam_update, muon_update, scalars_PK  # noqa: F401
from frontier_jax.reference import adam_update as _adam_ref, muon_update as _muon_ref  # noqa: F401
