"""Kernels no production op calls (`kernels_nki.registry` rows with `experimental` set): standalone forms
of work the model runs inside a fused kernel, kept with their tests (tests/experimental/)."""
