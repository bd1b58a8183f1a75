"""The parameter-golf record 2026-03-23 (LeakyReLU^2 + legal TTT + Parallel Muon, val_bpb 1.1194) as its README's
run command sets it (docs/recipe.md): 11 x 512, 8 / 4 heads, MLP 3x LeakyReLU(0.5)^2, BigramHash 1536 x 128,
XSA on the last 4 layers, partial RoPE on 16 dims with the base rescaled from length 1024, LN scale, value
embeddings 128 on layers 9 and 10, SmearGate, the record's initialisation and bf16 tables; sequences of 2048,
786,432 tokens per step, Muon at 0.025 with momentum 0.92 -> 0.99 over 1500 steps (bf16 gradient copy and
momentum, bf16 Newton-Schulz, the shape scale in the learning rate), Adam at 0.025 (scalars) and 0.035 (tied
embedding and tables), decoupled weight decay 0.04 on both, gradient clipping at 0.3 (the script's default), EMA
0.997 applied before the final evaluation (always on in the script), SWA every 50 steps below lr scale 0.2
(collected, never applied), late QAT below lr scale 0.15, warmdown 3500 steps, 600 s, at most 9000 steps, seed
1337.

The final evaluation is the record's (docs/evaluation.md): its int6 + lzma artifact, the round trip at the
training length (EVAL_SEQ_LEN=2048), sliding windows at EVAL_STRIDE=64, then its score-first test-time training
from the artifact's weights (TTT_ENABLED=1, TTT_LR=0.002, TTT_EPOCHS=3, TTT_CHUNK_TOKENS=32768,
TTT_FREEZE_BLOCKS=0, TTT_MOMENTUM=0.9, TTT_BATCH_SEQS=32, TTT_GRAD_CLIP=1.0), whose `legal_ttt` line is the score
(the record's submitted number).
"""

from frontier_jax.config import Config, EvalConfig, ModelConfig, OptimConfig, TrainConfig, TTTConfig


def recipe(**shape) -> ModelConfig:
    """The record's model switches (its run command and what its script hard-codes), at the record's shape unless
    `shape` replaces fields."""
    fields = dict(
        num_layers=11, model_dim=512, num_heads=8, num_kv_heads=4, mlp_mult=3.0, vocab_size=1024,
        mlp_negative_slope=0.5, rope_dims=16, rope_rescale_from=1024, ln_scale=True, xsa_last_n=4, smear_gate=True,
        bigram_buckets=1536, bigram_dim=128, ve_layers=(9, 10), ve_dim=128, init="record", embed_dtype="bfloat16",
    )
    return ModelConfig(**{**fields, **shape})


def get_config() -> Config:
    return Config(
        name="record11",
        model=recipe(),
        optim=OptimConfig(matrix_lr=0.025, scalar_lr=0.025, embed_lr=0.035, muon_momentum=0.99,
                          muon_momentum_warmup_start=0.92, muon_momentum_warmup_steps=1500, warmdown_steps=3500,
                          muon_ns_dtype="bfloat16", muon_momentum_dtype="bfloat16", muon_shape_scale="lr",
                          muon_weight_decay=0.04, adam_weight_decay=0.04, grad_clip_norm=0.3, ema_decay=0.997,
                          swa_every=50, swa_threshold=0.2, late_qat_threshold=0.15),
        train=TrainConfig(seq_len=2048, tokens_per_step=786_432, micro_batch_seqs=0, budget_seconds=600.0,
                          max_steps=9000, compile_warmup_steps=20, val_every_steps=4000, log_every_steps=500,
                          seed=1337),
        eval=EvalConfig(stride=64, artifact="int6_lzma", score="ttt"),
        ttt=TTTConfig(enabled=True, lr=0.002, epochs=3, chunk_tokens=32768, freeze_blocks=0, momentum=0.9,
                      batch_seqs=32, grad_clip=1.0),
    )
