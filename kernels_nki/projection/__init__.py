"""The projection kernels (docs/kernels/projection.md): `kernels` holds the @nki.jit entry points (the registry's
module), `forward` and `backward` / `norm_backward` their bodies, `mix` the residual mix, `matmul` and `weights`
the TensorE work, `state` the named per-group and per-row-tile state. Nothing is imported here: kernel files
import the real `nki` (kernels_nki/__init__.py)."""
