"""Weights and artifacts in other programs' formats: a run's parameters in the PyTorch baseline's state_dict
layout and the command line that exports and imports them (`state_dict`, `python -m frontier_jax.interop`),
weights.npz (`npz`), torch.save's file format written and read without torch (`torch_format`), the contest's
int8 + zlib artifact (`quantize`) and the parameter-golf record's state dict (banked and unbanked) and script
environment (`pg_record`). `npz`, `torch_format`, `quantize` and `pg_record` import no JAX and no torch (the
PyTorch baseline reads them); `state_dict` may import the JAX side (`model`, `optim`, `checkpoint`, `parallel`)
and the run directory (`run`); nothing here imports `ngram`, `neuron`, `compare`, the trainer or an entry point."""
