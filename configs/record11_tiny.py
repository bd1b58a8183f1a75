"""configs/record11.py's recipe at the tiny shape (the record's parity checks use the same shape): 4 x 128, 4 / 2
heads, MLP 3x LeakyReLU(0.5)^2, BigramHash 1536 x 64, XSA on the last 2 layers, partial RoPE on 16 of 32 head dims,
LN scale, value embeddings 128 on layers 2 and 3, SmearGate, the record's init; the record's optimizer, clipping,
EMA, SWA and late QAT (configs/record11.py) with a warmdown of 60 steps; sequences of 256 and 4,096 tokens per step
(a CPU demo in about two minutes, and the tests); test-time training in chunks of 4,096 targets (the record's parity
checks' TTT_CHUNK_TOKENS)."""

import dataclasses

from configs.record11 import get_config as _record11
from configs.record11 import recipe


def get_config():
    cfg = _record11()
    return dataclasses.replace(
        cfg,
        name="record11_tiny",
        model=recipe(num_layers=4, model_dim=128, num_heads=4, num_kv_heads=2, bigram_dim=64, xsa_last_n=2,
                     ve_layers=(2, 3)),
        # muon_ns_dtype auto: fp32 Newton-Schulz on CPU (bf16 dots are slower there), bf16 on accelerators
        optim=dataclasses.replace(cfg.optim, warmdown_steps=60, muon_momentum_warmup_steps=50, muon_ns_dtype="auto"),
        train=dataclasses.replace(cfg.train, seq_len=256, tokens_per_step=4096, micro_batch_seqs=16,
                                  budget_seconds=90.0, max_steps=2000, compile_warmup_steps=2, val_every_steps=100,
                                  val_max_tokens=65536, val_batch_seqs=32, log_every_steps=200),
        ttt=dataclasses.replace(cfg.ttt, chunk_tokens=4096),
    )
