"""The trn1 frontier: parameter-golf record 2026-03-23's recipe (configs/record11.py) on the strong Trainium entry's
system (configs/frontier14.py): 14 layers, the order-16 n-gram logit bias, the fused optimizer kernels, a 1800 s
budget on one trn1 chip, and the evaluation the Trainium contest allows (docs/recipe.md, "The trn1 frontier").

- Model: the record's switches (MLP 3x LeakyReLU(0.5)^2, BigramHash 1536 x 128, XSA on the last 4 layers, partial
  RoPE 16 rescaled from 1024, LN scale, SmearGate, the record's init and bf16 tables) at 14 x 512, 8 / 4 heads,
  value embeddings 128 on the last two layers (12 and 13, as the record's 9 and 10 of 11).
- The n-gram logit bias (orders 2..16, tables built from the train shards beside training): allowed under the
  Trainium contest's rules (its accepted entry built them so; the `eval_data` rule), refused under parameter-golf's
  (its artifact must hold everything the evaluation uses; the record's script has no such bias, so
  `interop export --format pg-record` refuses this config).
- Optimizer: the record's learning rates and Muon momentum 0.92 -> 0.99, with the fused Adam / Muon kernels. Its
  step-counted schedule is kept in proportion to the steps a run makes: the record's run made 7,179 steps in its
  600 s (its log), warmdown 3500 (49% of them) and momentum warm-up 1500 (21%); the trn1 step estimate
  (`python -m frontier_jax.kernel_report --config configs/frontier.py`: 3.17 s a step, about 570 steps in 1800 s)
  gives warmdown 280 (by wall clock, as the record's) and momentum warm-up 120. (The record's 3500 would start the
  learning rate at about 16% of its value.)
- Training: the record's sequences of 2048 and 786,432 tokens per step, 1800 s (the contest's 30 minutes), the
  micro-batch the largest that fits a NeuronCore (train.micro_batch_seqs=0).
- Evaluation: the record's int6 + lzma artifact, the round trip at 2048 and sliding windows at stride 64, the
  sliding line the score. Its state comes from the artifact and the train shards only, what the contest's rules
  allow; the record's score-first test-time training (state from scored val tokens, on which the contest states no
  rule) is configured as the record's but off: `--set ttt.enabled=True --set eval.score=ttt` adds it.
"""

import dataclasses

from configs.record11 import get_config as _record11
from configs.record11 import recipe


def get_config():
    cfg = _record11()
    return dataclasses.replace(
        cfg,
        name="frontier",
        model=recipe(num_layers=14, ve_layers=(12, 13)),
        ngram=dataclasses.replace(cfg.ngram, enabled=True),
        optim=dataclasses.replace(cfg.optim, fused=True, warmdown_steps=280, muon_momentum_warmup_steps=120),
        train=dataclasses.replace(cfg.train, budget_seconds=1800.0, max_steps=20_000, micro_batch_seqs=0),
        eval=dataclasses.replace(cfg.eval, score="sliding"),
        ttt=dataclasses.replace(cfg.ttt, enabled=False),
    )
