"""The attention kernels: `kernels` (the @nki.jit entry points), `forward`, `backward`, `steps` (the per-tile
stages both directions pipeline), `layout` (the DMA layouts), `rows` (a head's rows and transposes),
`rope_norm` (QK-norm, RoPE and gain), `xsa`, `saved` (the forward's residuals). Kernel files import the real
`nki`, so nothing is imported here (docs/kernels/attention.md)."""
