"""NKI kernels for the hot-path ops (NeuronCore-v2 / trn1), their CPU emulator and cost report.

Kernel modules (`rmsnorm`, ...) import the real `nki` at module level, so they are never imported
from here: `kernels_nki.registry` loads them on Neuron, `kernels_nki.emulator` runs the same source
on CPU. Nothing in this package reads the platform or the environment.
"""
