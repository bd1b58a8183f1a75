"""The parameter-golf baseline (docs/model.md): 9 x 512, 524,288 tokens/step, seq 1024, 30 min."""

from frontier_jax.config import Config, TrainConfig


def get_config() -> Config:
    return Config(name="baseline", train=TrainConfig(budget_seconds=1800.0))
