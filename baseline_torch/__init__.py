"""The PyTorch parameter-golf baseline (docs/comparison.md) in the project's harness.

`model` (GPT, interop .npz load/save), `optim` (Muon + Adam groups), `train` (the training loop and
`python -m baseline_torch.train`). PyTorch is an optional extra (`pip install -e .[torch]`); it is
imported only inside this package.
"""
