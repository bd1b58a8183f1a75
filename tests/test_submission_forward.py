"""The forward's checks: one forward (the eval step calls the model function the train step differentiates,
with no eval-only code), and the measured causal / normalized conditions; each fails on a model built to
break it."""

import jax.numpy as jnp
import pytest
from flax import nnx

from frontier_jax import ops
from frontier_jax.contest.rules import FAIL, PASS
from frontier_jax.model import GPT
from frontier_jax.submission import forward
from helpers import tiny_config

CFG = tiny_config("unused", "model.vocab_size=64", "train.seq_len=32")


class _FlagGPT(GPT):
    """A GPT with the flag nnx's `Module.eval()` sets (`deterministic`), False until then."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.deterministic = False


class EvalScaledGPT(_FlagGPT):
    """The rejected submission's pattern: at evaluation, a branch of its own that scales the logits."""

    def __call__(self, inputs_BT, targets_BT, bias_ids_BTS=None, bias_vals_BTS=None, *, qat=None):
        if not self.deterministic:
            return super().__call__(inputs_BT, targets_BT, bias_ids_BTS, bias_vals_BTS, qat=qat)
        B, T = inputs_BT.shape
        x_ND = self.hidden(inputs_BT, qat).reshape(B * T, self.cfg.model_dim)
        loss_N = ops.head_loss(x_ND * 1.05, self.tok_emb[...], targets_BT.reshape(B * T), self.cfg.logit_softcap)
        return loss_N.reshape(B, T)


class EvalConstantGPT(_FlagGPT):
    """An eval-only difference on one line: the same operation with another constant at evaluation."""

    def hidden(self, inputs_BT, qat=None):
        return super().hidden(inputs_BT, qat) * (1.05 if self.deterministic else 1.0)


class PeekingGPT(GPT):
    """Not causal: each position also sees the next token's embedding."""

    def hidden(self, inputs_BT, qat=None):
        x_BTD = super().hidden(inputs_BT, qat)
        return x_BTD + 0.5 * jnp.roll(self.tok_emb[...][inputs_BT], -1, axis=1).astype(x_BTD.dtype)


class UnnormalizedGPT(GPT):
    """Not a distribution: the per-token loss scaled down."""

    def __call__(self, inputs_BT, targets_BT, bias_ids_BTS=None, bias_vals_BTS=None, *, qat=None):
        return 0.9 * super().__call__(inputs_BT, targets_BT, bias_ids_BTS, bias_vals_BTS, qat=qat)


def _fns(cls):
    def model_fn(cfg, dtype):
        return cls(cfg.model, rngs=nnx.Rngs(0), compute_dtype=dtype)

    def eval_model_fn(cfg, dtype):
        m = model_fn(cfg, dtype)
        m.eval()  # the flag a trainer with an eval mode sets on the model it evaluates
        return m

    return model_fn, eval_model_fn


def test_the_trainers_steps_share_one_forward():
    v = forward.one_forward(CFG)
    assert v.verdict == PASS and "GPT.__call__" in v.evidence and "model.py" in v.evidence


@pytest.mark.parametrize("cls, shows", [(EvalScaledGPT, "test_submission_forward.py:"),
                                        (EvalConstantGPT, "mul 1.04999")])
def test_an_eval_only_branch_fails(cls, shows):
    model_fn, eval_model_fn = _fns(cls)
    assert forward.one_forward(CFG, model_fn=model_fn).verdict == PASS  # the flag never set: one forward
    v = forward.one_forward(CFG, model_fn=model_fn, eval_model_fn=eval_model_fn)
    assert v.verdict == FAIL and "eval-only model code" in v.evidence and shows in v.evidence


def test_causal_and_normalized_are_measured():
    causal, normalized = forward.causal_and_normalized(CFG)
    assert (causal.verdict, normalized.verdict) == (PASS, PASS), (causal, normalized)
    assert "at most 0.0e+00" in causal.evidence and "all 64 targets" in normalized.evidence


def test_a_model_that_peeks_or_does_not_normalize_fails():
    peek = forward.causal_and_normalized(CFG, model_fn=_fns(PeekingGPT)[0])[0]
    assert peek.verdict == FAIL and "changing the tokens from position t on" in peek.evidence
    scaled = forward.causal_and_normalized(CFG, model_fn=_fns(UnnormalizedGPT)[0])[1]
    assert scaled.verdict == FAIL
