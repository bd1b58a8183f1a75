"""Ops no production path calls, kept tested for benchmarks and as the standalone forms of work the model
runs fused: importing `frontier_jax.experimental.ops` declares them (their kernels are the
`kernels_nki.registry` rows with `experimental` set; the kernel table lists those "unused")."""
