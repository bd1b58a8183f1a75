"""The head_loss kernels (tied output head + softcap + fp32 cross-entropy, with the optional sparse n-gram bias):
`kernels` (the registry's module: head_loss_fwd, head_loss_bwd), `forward`, `backward`, `chunks` (the
vocabulary-chunk and row-tile pieces both directions use), `bias` (the sparse bias), `state` (the named per-group
and per-row-tile state). Layout, engine and port choices: docs/kernels/head_loss.md."""
