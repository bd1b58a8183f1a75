"""Trains usefully in about two minutes on two CPU cores (the embedded demo and the tests use it)."""

from frontier_jax.config import Config, ModelConfig, OptimConfig, TrainConfig


def get_config() -> Config:
    return Config(
        name="tiny",
        model=ModelConfig(num_layers=4, model_dim=128, num_heads=4, num_kv_heads=2, mlp_mult=2),
        # muon_ns_dtype auto: fp32 Newton-Schulz on CPU (bf16 dots are slower there), bf16 on accelerators
        optim=OptimConfig(warmdown_steps=60, muon_momentum_warmup_steps=50, muon_ns_dtype="auto"),
        train=TrainConfig(
            seq_len=256,
            tokens_per_step=8192,
            micro_batch_seqs=32,
            budget_seconds=90.0,
            max_steps=2000,
            compile_warmup_steps=2,
            val_every_steps=100,
            val_max_tokens=65536,
            val_batch_seqs=32,
        ),
    )
