"""Weights and artifacts in other programs' formats: a run's parameters in the PyTorch baseline's state_dict
layout and the command line that exports and imports them (`state_dict`, `python -m frontier_jax.interop`),
weights.npz (`npz`), torch.save's file format written and read without torch (`torch_format`), the
baseline's int8 + zlib artifact (`quantize`), record 2026-03-23's mixed int6 quantization (`int6`), a run's
artifact in either format (`artifact`) and the parameter-golf record's state dict (banked and unbanked) and
script environment (`pg_record`). `npz`, `torch_format`, `quantize`, `int6`, `artifact` and `pg_record` import no
JAX and no torch (the PyTorch baseline reads them); `state_dict` may import the JAX side (`model`, `optim`,
`checkpoint`, `parallel`) and the run directory (`run`); nothing here imports `ngram`, `neuron`, `compare`, the
trainer or an entry point."""
