"""Configuration: frozen dataclasses, loading `configs/*.py`, `--set` overrides, resolved JSON + hash.

A config file is a Python module exporting `get_config() -> Config`. Overrides are dotted keys
(`--set model.num_layers=4`), parsed with `ast.literal_eval` (bare words are taken as strings),
type-checked against the field they replace, and applied with `dataclasses.replace`, so the
dataclasses stay frozen. Unknown keys and wrong types raise `ConfigError` with a one-line message.
The library reads no environment variables: everything a run does is in this object.
"""

from __future__ import annotations

from frontier_jax.errors import BadInput

import ast
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import sys
import traceback
import typing
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(BadInput):
    """A configuration that cannot run (bad key, bad type, impossible combination)."""


# train.kernels: NKI kernels where available, the pure-JAX reference only, or fail if any is missing
# (frontier_jax.ops.dispatch; the CLI's --kernels).
KERNEL_MODES = ("auto", "reference", "strict")
MODEL_INITS = ("baseline", "record")  # model.init (frontier_jax.model)
# BigramHash's multipliers of (token, previous token), the record's (docs/recipe.md)
BIGRAM_HASH = (36313, 27191)
MUON_SHAPE_SCALES = ("update", "lr")  # optim.muon_shape_scale (frontier_jax.ops.reference.muon_direction)
# OptimConfig's record settings, in docs/recipe.md's order (defaults: the baseline's behaviour)
OPTIM_RECIPE_FIELDS = ("muon_weight_decay", "adam_weight_decay", "grad_clip_norm", "muon_momentum_dtype",
                       "muon_shape_scale", "ema_decay", "swa_every", "late_qat_threshold")
# ModelConfig's recipe switches, in docs/recipe.md's order (defaults: the baseline's behaviour)
RECIPE_SWITCHES = ("mlp_negative_slope", "rope_dims", "rope_rescale_from", "ln_scale", "xsa_last_n", "smear_gate",
                   "bigram_buckets", "bigram_dim", "ve_layers", "ve_dim")
MAX_SEED = (1 << 32) - 1  # train.seed: JAX's default (non-x64) PRNG key holds 32 bits; a larger seed aliases one
# rules.profile: the contest rule sets a run can be checked against (frontier_jax.contest.rules, docs/rules.md)
RULE_PROFILES = ("trainium-frontier", "parameter-golf")
# load_config imports a config file as a module of this name prefix (registered in sys.modules, so the run's
# code record, frontier_jax.contest.codebytes, counts and scans it with the project's code)
CONFIG_MODULE_PREFIX = "_frontier_config_"
MAX_VOCAB = 1 << 16  # model.vocab_size: shards hold uint16 token ids (frontier_jax.data.shards)


def _check_ranges(section: str, obj, **intervals: str) -> None:
    """ConfigError naming `section.field` for the first field outside its interval, written "[lo, hi)" ("(" and
    ")" open, "inf" unbounded; a NaN is in none): every numeric setting is range-checked when its section is
    built (a config file, `--set`, a run's config.json)."""
    for name, spec in intervals.items():
        value = getattr(obj, name)
        lo, hi = (float(x) for x in spec[1:-1].split(","))
        ok = (isinstance(value, int | float) and not isinstance(value, bool)
              and (value >= lo if spec[0] == "[" else value > lo) and (value <= hi if spec[-1] == "]" else value < hi))
        if not ok:
            raise ConfigError(f"{section}.{name} must be in {spec}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    vocab_size: int = 1024  # token ids 0..V-1; must equal the tokenizer's vocabulary (checked at start-up)
    num_layers: int = 9  # transformer blocks (U-Net skips pair the first half with the second)
    model_dim: int = 512  # D, the residual width
    num_heads: int = 8  # H, query heads (head dim K = model_dim / num_heads, even for RoPE)
    num_kv_heads: int = 4  # G, key/value heads (grouped-query attention; divides num_heads)
    mlp_mult: float = 2.0  # MLP hidden width F = int(mlp_mult * model_dim) (a float product, truncated)
    rope_base: float = 10000.0  # RoPE frequency base
    logit_softcap: float = 30.0  # logits are softcap * tanh(logits / softcap)
    qk_gain_init: float = 1.5  # initial per-head gain on the QK-normed queries
    tied_embed_init_std: float = 0.005  # init std of the tied input/output embedding
    # "auto": bfloat16 matmuls on accelerators (as the baseline), float32 on CPU (where bf16 dots were
    # measured slower: ~120 vs ~178 GFLOP/s). "bfloat16" / "float32" force it. The resolved choice is
    # logged and written to the run directory (see frontier_jax.policies.dtypes).
    compute_dtype: str = "auto"
    # Storage dtype of the embedding tables (tok_emb, bigram.embed, ve_shared.embed): "compute" (the compute
    # dtype, as the baseline) or "bfloat16" / "float32" whatever the compute dtype (the record holds them in bf16).
    embed_dtype: str = "compute"
    # ---- the recipe's switches (docs/recipe.md); each default is the baseline's behaviour
    mlp_negative_slope: float = 0.0  # MLP activation LeakyReLU(slope)^2; 0: relu^2
    rope_dims: int = 0  # RoPE on the first rope_dims dims of each head, the rest pass through; 0: the whole head
    rope_rescale_from: int = 0  # for T > this, RoPE base * (T / this)^(R / (R - 2)), R the rotated dims; 0: never
    ln_scale: bool = False  # both sublayer inputs rms_norm(x) * 1 / sqrt(layer + 1)
    xsa_last_n: int = 0  # XSA (the own value's component removed from the attention output) on the last N layers
    smear_gate: bool = False  # SmearGate after the embedding norm: (1 - g) x_t + g x_(t-1), g = sigmoid(gate)
    bigram_buckets: int = 0  # BigramHash: a table of this many buckets added to the embedding; 0: off
    bigram_dim: int = 128  # BigramHash table width (projected to model_dim when different)
    ve_layers: tuple[int, ...] = ()  # value embeddings added to v on these layers (absolute indices); (): off
    ve_dim: int = 128  # value-embedding table width (projected to the kv width when different)
    init: str = "baseline"  # "baseline" (PyTorch-default linears) | "record" (orthogonal, the record's init)

    def __post_init__(self):
        _check_ranges("model", self, vocab_size=f"[1, {MAX_VOCAB}]", num_layers="[1, inf)", model_dim="[1, inf)",
                      num_heads="[1, inf)", num_kv_heads="[1, inf)", mlp_mult="(0, inf)", rope_base="(0, inf)",
                      logit_softcap="(0, inf)", qk_gain_init="(-inf, inf)", tied_embed_init_std="[0, inf)",
                      mlp_negative_slope="(-inf, inf)", rope_dims="[0, inf)", rope_rescale_from="[0, inf)",
                      xsa_last_n="[0, inf)", bigram_buckets="[0, inf)", bigram_dim="[1, inf)", ve_dim="[1, inf)")
        if self.model_dim % self.num_heads:
            raise ConfigError(f"model.model_dim={self.model_dim} is not divisible by model.num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model.num_heads={self.num_heads} is not a multiple of model.num_kv_heads={self.num_kv_heads}")
        if (self.model_dim // self.num_heads) % 2:
            raise ConfigError("model head dim must be even for the half-split RoPE")
        if self.compute_dtype not in ("auto", "bfloat16", "float32"):
            raise ConfigError(f"model.compute_dtype must be auto|bfloat16|float32, got {self.compute_dtype!r}")
        object.__setattr__(self, "mlp_mult", float(self.mlp_mult))  # an int from a config file is the same float
        object.__setattr__(self, "ve_layers", tuple(self.ve_layers))
        self._check_recipe()

    def _check_recipe(self):
        """The recipe's settings against each other and the shape (their ranges are in __post_init__)."""
        if self.embed_dtype not in ("compute", "bfloat16", "float32"):
            raise ConfigError(f"model.embed_dtype must be compute|bfloat16|float32, got {self.embed_dtype!r}")
        if self.init not in MODEL_INITS:
            raise ConfigError(f"model.init must be {'|'.join(MODEL_INITS)}, got {self.init!r}")
        if self.mlp_hidden <= 0:
            raise ConfigError(f"model.mlp_mult={self.mlp_mult} gives no MLP hidden unit at model_dim={self.model_dim}")
        _check_ranges("model", self, xsa_last_n=f"[0, {self.num_layers}]")
        K, R = self.head_dim, self.rope_dims
        if R % 2 or R > K:
            raise ConfigError(f"model.rope_dims={R} must be even and in [0, head dim {K}] (0: the whole head)")
        if self.rope_rescale_from and self.rotary_dims <= 2:
            raise ConfigError(f"model.rope_rescale_from needs more than 2 rotated dims (the exponent is R / (R - 2)), "
                              f"got {self.rotary_dims}")
        if self.bigram_buckets == 1:
            raise ConfigError("model.bigram_buckets must be 0 (off) or >= 2 (one bucket is reserved for position 0), "
                              "got 1")
        if self.bigram_buckets and self.vocab_size * max(BIGRAM_HASH) >= 2 ** 31:
            raise ConfigError(f"model.vocab_size={self.vocab_size}: BigramHash's int32 products "
                              f"{BIGRAM_HASH} x token id overflow from id {2 ** 31 // max(BIGRAM_HASH)}")
        bad = [i for i in self.ve_layers if not (isinstance(i, int) and 0 <= i < self.num_layers)]
        if bad or len(set(self.ve_layers)) != len(self.ve_layers):
            raise ConfigError(f"model.ve_layers={self.ve_layers}: distinct layer indices in [0, {self.num_layers}) "
                              "expected")

    @property
    def head_dim(self) -> int:
        return self.model_dim // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        """F = int(mlp_mult * model_dim): the float product truncated (3.0 * 512 = 1536; 2.9 * 512 -> 1484)."""
        return int(self.mlp_mult * self.model_dim)

    @property
    def rotary_dims(self) -> int:
        """R, the head dims RoPE rotates: rope_dims, or the whole head (rope_dims = 0)."""
        return self.rope_dims or self.head_dim

    def layer_ln_scale(self, layer: int) -> float:
        """The factor on both sublayer inputs of block `layer` (0-based): 1 / sqrt(layer + 1) with ln_scale, else 1."""
        return 1.0 / math.sqrt(layer + 1) if self.ln_scale else 1.0

    def xsa_layers(self) -> range:
        """The blocks whose attention uses XSA: the last xsa_last_n."""
        return range(self.num_layers - self.xsa_last_n, self.num_layers)

    def recipe_switches(self) -> list[str]:
        """`model.<field>=<value>` of every recipe switch (and init / table dtype) set away from its default."""
        base = ModelConfig()
        fields = ("embed_dtype",) + RECIPE_SWITCHES + ("init",)
        return [f"model.{f}={getattr(self, f)!r}" for f in fields if getattr(self, f) != getattr(base, f)]

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward) of this architecture, attention included
        (the MFU numerator of both trainers and of frontier_jax.neuron.kernel_report).

        Matmul FLOPs: 2 per MAC. Attention scores and values: causal, so on average T/2 keys per query
        (counted as the full T*T/2 triangle: 2 * 2 * H * K * T/2 per token forward). The recipe's BigramHash and
        value-embedding projections count once per token (table lookups are not FLOPs).
        """
        D, H, G, K = self.model_dim, self.num_heads, self.num_kv_heads, self.head_dim
        F, V, L = self.mlp_hidden, self.vocab_size, self.num_layers
        per_layer = 2 * (D * H * K + 2 * D * G * K + H * K * D + 2 * D * F)
        attn = 2 * 2 * H * K * (seq_len / 2)
        bigram = 2 * self.bigram_dim * D if self.bigram_buckets and self.bigram_dim != D else 0
        ve = 2 * self.ve_dim * G * K if self.ve_layers and self.ve_dim != G * K else 0
        return 3.0 * (L * (per_layer + attn) + 2 * D * V + bigram + ve)


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    matrix_lr: float = 0.04  # Muon, block matrices
    scalar_lr: float = 0.04  # Adam, vectors / scalars (scales, mixes, q gains, skip weights)
    embed_lr: float = 0.05  # Adam, tied embedding
    ngram_lr: float = 0.04  # Adam, the n-gram logit-bias table (when ngram.enabled)
    beta1: float = 0.9  # Adam first-moment decay
    beta2: float = 0.95  # Adam second-moment decay
    adam_eps: float = 1e-8  # Adam denominator epsilon
    muon_momentum: float = 0.95  # Muon Nesterov momentum after the warm-up
    muon_momentum_warmup_start: float = 0.85  # Muon momentum at step 0, raised linearly ...
    muon_momentum_warmup_steps: int = 500  # ... to muon_momentum over this many steps
    muon_ns_steps: int = 5  # Newton-Schulz iterations of Muon's orthogonalisation
    # Newton-Schulz precision: the baseline runs it in bf16; "float32" exists for parity tests; "auto":
    # bfloat16 on accelerators, float32 on CPU (where bf16 dots are slower), resolved and logged at start-up
    # (frontier_jax.policies.dtypes).
    muon_ns_dtype: str = "bfloat16"
    warmdown_steps: int = 1200  # the learning rate decays linearly to 0 over the last this-many steps
    # "time": the warmdown start is computed from measured wall-clock step time (the baseline);
    # "steps": from train.max_steps (deterministic; used by the kill-and-resume test).
    warmdown_mode: str = "time"
    fused: bool = False  # fused Adam/Muon updates, one primitive (NKI kernel) per parameter
    # ---- the record's optimizer and averaging (docs/recipe.md); each default is the baseline's behaviour
    # Decoupled weight decay, as the record's Muon and AdamW apply it: p *= 1 - lr * wd before the update, lr the
    # scheduled learning rate of the parameter's group.
    muon_weight_decay: float = 0.0  # on the block matrices (Muon)
    adam_weight_decay: float = 0.0  # on every Adam parameter: tables, scalars, gates, projections, n-gram bias
    # Global gradient-norm clipping before the update (torch's clip_grad_norm_): every gradient times
    # min(1, grad_clip_norm / (norm + 1e-6)), norm the L2 norm over all of them; 0: off.
    grad_clip_norm: float = 0.0
    # Muon's gradient copy and momentum buffer: "float32" (the baseline) or "bfloat16" (the record: the gradient
    # rounded to bf16, the buffer bf16, rounded after each of its multiply and add).
    muon_momentum_dtype: str = "float32"
    # Where Muon's shape scale sqrt(max(1, out / in)) goes: "update" (the baseline: it multiplies the
    # Newton-Schulz output, rounded to the NS dtype) or "lr" (the record: into the learning rate, in fp32).
    muon_shape_scale: str = "update"
    # EMA of all weights in fp32 after every optimizer step, ema = decay * ema + (1 - decay) * p, from the initial
    # weights; the final evaluation, the export and the artifact use it (cast to each parameter's dtype). 0: off.
    ema_decay: float = 0.0
    # SWA as the record keeps it: the weights summed every swa_every steps once the lr scale is below
    # swa_threshold (counted in the optimizer state, checkpointed); collected, never applied. 0: off.
    swa_every: int = 0  # steps between the weights taken (0: no SWA)
    swa_threshold: float = 0.2  # the weights are taken only below this lr scale
    # Late QAT: once the lr scale falls below this, the recipe's two side projections (BigramHash's and the value
    # embeddings') are fake-quantized to int6 in training forwards (straight-through); it never switches off. inf:
    # from the first step; 0: off.
    late_qat_threshold: float = 0.0

    def __post_init__(self):
        _check_ranges("optim", self, matrix_lr="[0, inf)", scalar_lr="[0, inf)", embed_lr="[0, inf)",
                      ngram_lr="[0, inf)", beta1="[0, 1)", beta2="[0, 1)", adam_eps="(0, inf)",
                      muon_momentum="[0, 1)", muon_momentum_warmup_start="[0, 1)",
                      muon_momentum_warmup_steps="[0, inf)", muon_ns_steps="[1, inf)", warmdown_steps="[0, inf)",
                      muon_weight_decay="[0, inf)", adam_weight_decay="[0, inf)", grad_clip_norm="[0, inf)",
                      ema_decay="[0, 1)", swa_every="[0, inf)", swa_threshold="[0, inf]",
                      late_qat_threshold="[0, inf]")
        if self.muon_ns_dtype not in ("auto", "bfloat16", "float32"):
            raise ConfigError(f"optim.muon_ns_dtype must be auto|bfloat16|float32, got {self.muon_ns_dtype!r}")
        if self.warmdown_mode not in ("time", "steps"):
            raise ConfigError(f"optim.warmdown_mode must be time|steps, got {self.warmdown_mode!r}")
        if self.muon_momentum_dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"optim.muon_momentum_dtype must be float32|bfloat16, got {self.muon_momentum_dtype!r}")
        if self.muon_shape_scale not in MUON_SHAPE_SCALES:
            raise ConfigError(f"optim.muon_shape_scale must be {'|'.join(MUON_SHAPE_SCALES)}, got "
                              f"{self.muon_shape_scale!r}")

    def recipe_settings(self) -> list[str]:
        """`optim.<field>=<value>` of every record setting (weight decay to late QAT) set away from its default."""
        base = OptimConfig()
        return [f"optim.{f}={getattr(self, f)!r}" for f in OPTIM_RECIPE_FIELDS if getattr(self, f) != getattr(base, f)]


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    data_dir: str = ""  # directory holding *_train_*.bin and *_val_*.bin shards
    tokenizer: str = ""  # a SentencePiece .model path, or "bytes" for the byte-level tokenizer
    train_pattern: str = "*_train_*.bin"  # glob of the train shards in data_dir (read in name order)
    val_pattern: str = "*_val_*.bin"  # glob of the val shards in data_dir (concatenated in name order)
    # Refuse to start when more than this share of the val split's document tokens are documents that
    # also occur in the train split (exact duplicates; frontier_jax.data.integrity). 0.001: perfectly
    # memorised duplicates could lower val bpb by at most this share of it (~0.001 bpb at 1.2 bpb), near
    # the 0.0005 bpb noise level, while a leaked shard or a pattern matching val gives 1.0.
    max_val_duplicate_share: float = 0.001

    def __post_init__(self):
        for name in ("train_pattern", "val_pattern"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"data.{name} must be a non-empty glob pattern, got {getattr(self, name)!r}")
        if not 0.0 <= self.max_val_duplicate_share <= 1.0:
            raise ConfigError(f"data.max_val_duplicate_share must be in [0, 1], got {self.max_val_duplicate_share}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    seq_len: int = 1024  # T, tokens per training and validation window
    tokens_per_step: int = 524_288  # global, across all devices and accumulation steps
    # Sequences per device per micro-batch (accumulation fills the rest of the step, whose result does not
    # change). 0: auto, the largest that fits the device's memory up to 64, the baseline's (estimated before
    # anything is compiled or allocated: frontier_jax.neuron.memory); a set value that cannot fit is refused.
    micro_batch_seqs: int = 0
    budget_seconds: float = 1800.0  # wall-clock training budget (warm-up and validation excluded)
    max_steps: int = 20_000  # stop after this many steps even if budget remains
    compile_warmup_steps: int = 20  # untimed steps, then weights/optimizer/data are reset
    val_every_steps: int = 0  # 0: only the final validation
    val_max_tokens: int = 0  # periodic validation on at most this many tokens (0: full val)
    val_batch_seqs: int = 64  # windows per validation batch (global; > 0)
    checkpoint_every_steps: int = 0  # 0: only final and on signals
    log_every_steps: int = 200  # progress: a train.log line every this many steps (metrics.jsonl has every step)
    log_every_seconds: float = 30.0  # ... or every this many seconds, whichever comes first (frontier_jax.run.progress)
    seed: int = 1337  # parameter init seed
    kernels: str = "auto"  # one of KERNEL_MODES (see frontier_jax.ops)
    # C allocator of the host process (frontier_jax.run.host): "reuse" keeps XLA's per-step temporary buffer
    # in the heap instead of mmap/munmap + page faults every step (CPU: 1.1-1.3x faster steps); "system"
    # leaves glibc's defaults; "auto": reuse when JAX runs on the CPU, system with an accelerator.
    # Applied by the entry points before the JAX backend starts; the resolved choice goes to env.json.
    allocator: str = "auto"
    # Probe the device's matmul peak at start-up (the MFU denominator; seconds on a CPU). False: no probe,
    # and the summary has no MFU (the test suite's tiny runs).
    measure_peak: bool = True

    def __post_init__(self):
        if self.allocator not in ("auto", "reuse", "system"):
            raise ConfigError(f"train.allocator must be auto|reuse|system, got {self.allocator!r}")
        if not self.budget_seconds > 0:  # (a NaN too)
            raise ConfigError(f"train.budget_seconds must be > 0, got {self.budget_seconds}")
        _check_ranges("train", self, log_every_seconds="(0, inf]")
        if self.kernels not in KERNEL_MODES:
            raise ConfigError(f"train.kernels must be {'|'.join(KERNEL_MODES)}, got {self.kernels!r}")
        if self.seq_len <= 0 or self.tokens_per_step <= 0:
            raise ConfigError("train.seq_len and train.tokens_per_step must be positive")
        if self.micro_batch_seqs < 0:
            raise ConfigError(f"train.micro_batch_seqs must be >= 0 (0: auto, the largest that fits), got "
                              f"{self.micro_batch_seqs}")
        if self.tokens_per_step % self.seq_len:
            raise ConfigError(f"train.tokens_per_step={self.tokens_per_step} is not a multiple of train.seq_len={self.seq_len}")
        if self.max_steps <= 0:
            raise ConfigError("train.max_steps must be positive")
        if self.val_batch_seqs <= 0:
            raise ConfigError(f"train.val_batch_seqs must be positive, got {self.val_batch_seqs}")
        for name in ("val_every_steps", "checkpoint_every_steps", "compile_warmup_steps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0 (0: never), got {getattr(self, name)}")
        if self.log_every_steps <= 0:
            raise ConfigError(f"train.log_every_steps must be positive, got {self.log_every_steps}")
        if self.val_max_tokens != 0 and self.val_max_tokens < self.seq_len:
            raise ConfigError(f"train.val_max_tokens={self.val_max_tokens} scores no whole window: it must be 0 "
                              f"(the full val split) or >= train.seq_len={self.seq_len}")
        if not 0 <= self.seed <= MAX_SEED:
            # JAX keys take a uint32 seed without x64 (a larger one aliases a smaller one), torch a uint64
            raise ConfigError(f"train.seed must be in [0, 2**32 - 1], got {self.seed}")


MAX_TABLE_LOG2_SIZE = 30
TABLE_ROW_BYTES = 16  # 4 uint32 words per bucket: frontier_jax.ngram.hashing.ROW_WORDS * 4 (tested equal)


def host_memory_bytes() -> int | None:
    """Physical memory of this host (sysconf), or None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(frozen=True, kw_only=True)
class NgramConfig:
    enabled: bool = False  # the n-gram logit bias (tables built beside training, a learned bias per order)
    min_order: int = 2  # lowest order, in tokens of context
    max_order: int = 16  # highest order, in tokens of context
    table_log2_size: int = 20  # log2 of the buckets per order (1..30)
    max_table_bytes: int = 2 << 30  # cap over all orders; exceeding it is a config error
    confidence_buckets: int = 8  # C, the learned bias is per (order, confidence bucket of the table's top token)
    builder_processes: int = 1  # host processes building the tables
    builder_niceness: int = 10  # os.nice of the builder processes (training keeps priority)
    builder_shards_from_end: int = 1  # the builder reads this many shards from the far end of the stream
    snapshot_every_tokens: int = 10_000_000  # the builder publishes a table snapshot every this many tokens
    strict: bool = False  # a builder failure stops the run (default: logged loudly, training goes on)

    def __post_init__(self):
        if not self.enabled:
            return
        if not 1 <= self.min_order <= self.max_order:
            raise ConfigError(f"ngram.min_order={self.min_order} must be >= 1 and <= ngram.max_order={self.max_order}")
        if not 1 <= self.table_log2_size <= MAX_TABLE_LOG2_SIZE:
            raise ConfigError(f"ngram.table_log2_size must be in [1, {MAX_TABLE_LOG2_SIZE}], got {self.table_log2_size}")
        if self.table_bytes > self.max_table_bytes:
            raise ConfigError(f"ngram tables need {self.table_bytes} bytes ({self.num_orders} orders x "
                              f"{self.table_bytes // self.num_orders}), over ngram.max_table_bytes={self.max_table_bytes}")
        if self.confidence_buckets <= 0 or self.snapshot_every_tokens <= 0:
            raise ConfigError("ngram.confidence_buckets and ngram.snapshot_every_tokens must be positive")
        _check_ranges("ngram", self, builder_shards_from_end="[1, inf)", builder_niceness="[0, 19]",
                      max_table_bytes="[1, inf)")
        if self.builder_processes != 1:
            raise ConfigError(f"ngram.builder_processes={self.builder_processes}: only 1 builder process is implemented")
        host = host_memory_bytes()
        if host is not None and self.table_bytes > host // 2:
            raise ConfigError(f"ngram tables need {self.table_bytes} bytes, over half of this host's "
                              f"{host} bytes of memory (the builder and the trainer each hold a copy)")

    @property
    def num_orders(self) -> int:
        """O, the orders min_order..max_order."""
        return self.max_order - self.min_order + 1

    @property
    def bias_orders(self) -> int:
        """Rows of the model's learned n-gram bias: num_orders when enabled, else 0."""
        return self.num_orders if self.enabled else 0

    @property
    def table_bytes(self) -> int:
        """Bytes of the tables over all orders: 2**table_log2_size rows of TABLE_ROW_BYTES per order."""
        return self.num_orders * (1 << self.table_log2_size) * TABLE_ROW_BYTES


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    num_devices: int = 0  # devices on the data axis; 0: all devices of all processes
    zero1: bool = False  # shard optimizer state across the data axis
    heartbeat_timeout_seconds: int = 30  # multi-host: a dead peer fails the others within about this

    def __post_init__(self):
        if self.num_devices < 0:
            raise ConfigError("parallel.num_devices must be >= 0 (0: all devices)")
        _check_ranges("parallel", self, heartbeat_timeout_seconds="(0, inf)")


# eval.artifact -> the prefix of its score lines (`final_int8_zlib_roundtrip`, the baseline's; `final_int6_roundtrip`,
# record 2026-03-23's): docs/evaluation.md, "The final evaluation"
ARTIFACT_LINES = {"int8_zlib": "final_int8_zlib", "int6_lzma": "final_int6"}
# eval.score -> which final line is the run's score (the stage's suffix after the artifact's prefix; the TTT stage's
# line is the record's `legal_ttt`, whatever the artifact: `line_name`)
SCORE_STAGES = {"roundtrip": "_roundtrip", "sliding": "_sliding_window", "ttt": ""}
TTT_LINE = "legal_ttt"  # the score line of score-first test-time training (record 2026-03-23, train_gpt.py:1892-1894)


def line_name(artifact: str, stage: str) -> str:
    """The score line of a final stage (`roundtrip`, `sliding`, `ttt`) for an eval.artifact, e.g.
    final_int6_sliding_window, final_int8_zlib_roundtrip, legal_ttt."""
    return TTT_LINE if stage == "ttt" else ARTIFACT_LINES[artifact] + SCORE_STAGES[stage]


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    # T of the round-trip and sliding-window validations (the record's EVAL_SEQ_LEN); 0: train.seq_len. The val
    # split is cut to whole windows of max(train.seq_len, this), as the record cuts it.
    seq_len: int = 0
    # 0: no sliding-window line; else the final pipeline scores sliding windows at this stride on the round trip's
    # weights (every target exactly once), after the round-trip line
    stride: int = 0
    artifact: str = "int8_zlib"  # int8_zlib (the baseline's final_model.int8.ptz) | int6_lzma (the record's .int6.ptz)
    score: str = "roundtrip"  # which final line is the run's score (summary.json `score`): roundtrip | sliding | ttt
    batch_seqs: int = 0  # windows per batch of the sliding windows; 0: train.val_batch_seqs

    def __post_init__(self):
        _check_ranges("eval", self, seq_len="[0, inf)", stride="[0, inf)", batch_seqs="[0, inf)")
        if self.artifact not in ARTIFACT_LINES:
            raise ConfigError(f"eval.artifact must be {'|'.join(ARTIFACT_LINES)}, got {self.artifact!r}")
        if self.score not in SCORE_STAGES:
            raise ConfigError(f"eval.score must be {'|'.join(SCORE_STAGES)}, got {self.score!r}")
        if self.score == "sliding" and not self.stride:
            raise ConfigError("eval.score='sliding' needs eval.stride > 0 (no sliding-window line is scored)")


@dataclass(frozen=True, kw_only=True)
class TTTConfig:
    """Score-first test-time training, record 2026-03-23's `eval_val_sliding_ttt` (docs/evaluation.md, "Score-first
    test-time training"): the val split cut into chunks of chunk_tokens targets; each sliding window (eval.stride,
    windows of train.seq_len) belongs to the chunk of its first scored target; each chunk's windows are scored,
    then the weights train on the chunk's whole rows of train.seq_len for `epochs` epochs of SGD; the last chunk is
    scored and never trained on. Each default is the record's run command's."""

    enabled: bool = False  # a TTT stage after the sliding windows (the run's final pipeline; evaluate --ttt)
    lr: float = 0.002  # SGD learning rate of chunk 0, cosine-decayed across chunks to 0 at the last
    epochs: int = 3  # passes over each chunk's rows
    chunk_tokens: int = 32768  # targets per chunk (at least one row of train.seq_len)
    # the first N blocks' parameters (everything under blocks.{i}, i < N: matrices and control tensors) stay fixed;
    # the record's TTT_FREEZE_BLOCKS reaches only its blocks' control tensors (its matrices live in banks outside
    # blocks.*), docs/recipe.md; the record's run uses 0
    freeze_blocks: int = 0
    momentum: float = 0.9  # SGD momentum (no Nesterov, no dampening, no weight decay; its buffers carry across chunks)
    batch_seqs: int = 32  # rows per SGD step (global)
    grad_clip: float = 1.0  # global gradient-norm clip over the trained parameters before each step; 0: off

    def __post_init__(self):
        _check_ranges("ttt", self, lr="[0, inf)", epochs="[0, inf)", chunk_tokens="[1, inf)",
                      freeze_blocks="[0, inf)", momentum="[0, 1)", batch_seqs="[1, inf)", grad_clip="[0, inf)")


@dataclass(frozen=True, kw_only=True)
class RulesConfig:
    # The contest rule set the run's score is claimed under (one of RULE_PROFILES): its summary and score
    # lines name it, and `python -m frontier_jax.submission check RUN` reports the run against every rule of it.
    profile: str = "trainium-frontier"

    def __post_init__(self):
        if self.profile not in RULE_PROFILES:
            raise ConfigError(f"rules.profile must be {'|'.join(RULE_PROFILES)}, got {self.profile!r}")


@dataclass(frozen=True, kw_only=True)
class Config:
    name: str = "baseline"  # the run's name (default run directory runs/<name>-<time>)
    model: ModelConfig = field(default_factory=ModelConfig)  # the network's shape and init
    optim: OptimConfig = field(default_factory=OptimConfig)  # Muon + Adam and the schedule
    data: DataConfig = field(default_factory=DataConfig)  # where the shards and the tokenizer are
    train: TrainConfig = field(default_factory=TrainConfig)  # batch, budget, validation, checkpoints
    ngram: NgramConfig = field(default_factory=NgramConfig)  # the optional n-gram logit bias
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # data parallelism
    rules: RulesConfig = field(default_factory=RulesConfig)  # the contest rule set (frontier_jax.contest)
    eval: EvalConfig = field(default_factory=EvalConfig)  # the final evaluation pipeline: lengths, stride, artifact
    ttt: TTTConfig = field(default_factory=TTTConfig)  # score-first test-time training (the final pipeline's end)

    @property
    def eval_seq_len(self) -> int:
        """T of the round-trip and sliding-window validations: eval.seq_len, or train.seq_len when it is 0."""
        return self.eval.seq_len or self.train.seq_len

    @property
    def val_seq_len(self) -> int:
        """The val split is cut to whole windows of this many tokens (+1): the longer of the two lengths."""
        return max(self.train.seq_len, self.eval_seq_len)

    def __post_init__(self):
        """Each section of its type (a config file's `get_config` returning `model=None` failed much later), a
        name that can be a run directory's (runs/<name>-<time>): no directory part, and a sliding-window stride
        within the eval window."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            if f.name != "name" and not isinstance(getattr(self, f.name), hints[f.name]):
                raise ConfigError(f"config section {f.name} is {type(getattr(self, f.name)).__name__}, expected "
                                  f"{hints[f.name].__name__}")
        if not isinstance(self.name, str) or not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"config name {self.name!r} must be a file name (runs/<name>-<time>), with no '/'")
        T, stride = self.eval_seq_len, self.eval.stride
        if stride > T:
            raise ConfigError(f"eval.stride={stride} is longer than the eval window of {T} tokens (eval.seq_len, "
                              "0: train.seq_len)")
        self._check_ttt()

    @property
    def ttt_stride(self) -> int:
        """The stride of the TTT windows: eval.stride (the record's EVAL_STRIDE), or train.seq_len when it is 0
        (non-overlapping windows)."""
        return self.eval.stride or self.train.seq_len

    def _check_ttt(self) -> None:
        """The TTT stage against the other sections: its windows are train.seq_len long (the record's, SPEC Q12)."""
        t, T = self.ttt, self.train.seq_len
        if self.eval.score == "ttt" and not t.enabled:
            raise ConfigError("eval.score='ttt' needs ttt.enabled=True (no TTT line is scored)")
        if not t.enabled:
            return
        if self.ttt_stride > T:
            raise ConfigError(f"ttt.enabled: eval.stride={self.eval.stride} is longer than the TTT windows of "
                              f"train.seq_len={T} tokens")
        if t.chunk_tokens < T:
            raise ConfigError(f"ttt.chunk_tokens={t.chunk_tokens} holds no whole row of train.seq_len={T}: TTT "
                              "would never train")
        if t.freeze_blocks > self.model.num_layers:
            raise ConfigError(f"ttt.freeze_blocks={t.freeze_blocks} is more than the model's "
                              f"{self.model.num_layers} blocks")


# ----------------------------------------------------------------------------- loading / overrides


def load_config(path: str | Path) -> Config:
    """Import a config file and call its `get_config()`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    spec = importlib.util.spec_from_file_location(f"{CONFIG_MODULE_PREFIX}{path.stem}", path)
    if spec is None:
        raise ConfigError(f"{path}: not a Python config file (expected a .py module defining get_config())")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # an import like any other: the run's code record lists it
    try:
        with _config_errors(path, "loading"):
            spec.loader.exec_module(module)
    except ConfigError:
        sys.modules.pop(spec.name, None)
        raise
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path}: config file defines no get_config()")
    with _config_errors(path, "get_config()"):
        cfg = module.get_config()
    if not isinstance(cfg, Config):
        raise ConfigError(f"{path}: get_config() returned {type(cfg).__name__}, expected frontier_jax.config.Config")
    return cfg


@contextlib.contextmanager
def _config_errors(path: Path, stage: str):
    """Any exception of a config file's own code -> one-line ConfigError naming the file (and line)."""
    try:
        yield
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: syntax error ({e.msg})") from None
    except Exception as e:  # the file is the user's code: an import error, a typo, anything it raises
        tb = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path]
        where = f"{path}:{tb[-1].lineno}" if tb else str(path)
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"{where}: {stage} failed: {type(e).__name__}: {first}".rstrip(": ")) from None


_FLOAT_WORDS = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf}


def _parse_value(raw: str):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # bare word: a string ("inf" too: _check_type turns it into a float for a float field)


def _check_type(key: str, annotation, value, where: str = "--set "):
    """`value` for a field of type `annotation` (int widened to float; a tuple of ints from a tuple or a list, e.g.
    `--set model.ve_layers=(2,3)` or a JSON list); ConfigError naming `where``key`."""
    if typing.get_origin(annotation) is tuple:
        item = typing.get_args(annotation)[0]
        if not isinstance(value, (tuple, list)):
            raise ConfigError(f"{where}{key}={value!r}: expected a tuple of {item.__name__}, got {type(value).__name__}")
        return tuple(_check_type(f"{key}[{i}]", item, v, where) for i, v in enumerate(value))
    hints = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
    allowed = hints.get(annotation)
    if allowed is None:
        raise ConfigError(f"{where}{key}: cannot override a field of type {annotation}")
    if annotation is float and isinstance(value, str) and value.strip().lower() in _FLOAT_WORDS:
        return _FLOAT_WORDS[value.strip().lower()]  # repr(math.inf) == "inf" is not a Python literal
    if annotation is not bool and isinstance(value, bool):
        raise ConfigError(f"{where}{key}={value!r}: expected {annotation.__name__}, got bool")
    if not isinstance(value, allowed):
        raise ConfigError(f"{where}{key}={value!r}: expected {annotation.__name__}, got {type(value).__name__}")
    return float(value) if annotation is float else value


def _checked_value(obj, parts: list[str], value, key: str):
    """`value` type-checked for the field at `parts` below `obj` (ConfigError naming `key`)."""
    if not dataclasses.is_dataclass(obj):
        raise ConfigError(f"--set {key}: unknown key")
    fields = {f.name: f for f in dataclasses.fields(obj)}
    if parts[0] not in fields:
        raise ConfigError(f"--set {key}: unknown key (no field {parts[0]!r} in {type(obj).__name__})")
    if len(parts) == 1:
        annotation = typing.get_type_hints(type(obj))[parts[0]]
        if dataclasses.is_dataclass(annotation):
            raise ConfigError(f"--set {key}: is a section, set one of its fields")
        return _check_type(key, annotation, value)
    return _checked_value(getattr(obj, parts[0]), parts[1:], value, key)


def apply_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """Apply `key=value` strings (dotted keys) to a frozen config.

    Every value is type-checked first; then each section is rebuilt once with all of its new values,
    so the section's checks (`__post_init__`) see the final combination whatever the order of the
    flags (e.g. `ngram.max_table_bytes` before or after `ngram.table_log2_size`)."""
    changes: dict[tuple[str, ...], dict[str, object]] = {}
    keys: dict[tuple[str, ...], list[str]] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        value = _checked_value(cfg, parts, _parse_value(raw.strip()), key)
        changes.setdefault(tuple(parts[:-1]), {})[parts[-1]] = value
        for i in range(len(parts)):
            keys.setdefault(tuple(parts[:i]), []).append(key)

    def rebuild(obj, prefix: tuple[str, ...]):
        kwargs = dict(changes.get(prefix, {}))
        for f in dataclasses.fields(obj):
            if prefix + (f.name,) in keys and dataclasses.is_dataclass(getattr(obj, f.name)):
                kwargs[f.name] = rebuild(getattr(obj, f.name), prefix + (f.name,))
        try:
            return dataclasses.replace(obj, **kwargs)
        except ConfigError as e:
            if str(e).startswith("--set "):
                raise
            raise ConfigError(f"--set {', '.join(dict.fromkeys(keys[prefix]))}: {e}") from None

    return rebuild(cfg, ()) if changes else cfg


def to_dict(cfg) -> dict:
    """The config as a dict of JSON values: an infinite float (`--budget inf`) as the word "inf" / "-inf", which
    `from_dict` reads back (strict JSON has no Infinity, and a run directory's JSON is strict)."""
    def word(v):
        return ("inf" if v > 0 else "-inf") if isinstance(v, float) and math.isinf(v) else v

    return {k: ({f: word(x) for f, x in v.items()} if isinstance(v, dict) else word(v))
            for k, v in dataclasses.asdict(cfg).items()}


def from_dict(d: dict) -> Config:
    """Inverse of `to_dict` (used to reload a run's resolved config); values are type-checked as `--set`'s."""

    def build(cls, data, prefix):
        if not isinstance(data, dict):
            raise ConfigError(f"{prefix or 'config'}: expected an object, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:  # a field this version does not have: refused, never dropped silently
            raise ConfigError(f"{prefix}{unknown[0]}: unknown key (no field {unknown[0]!r} in {cls.__name__})")
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            t, key = hints[f.name], f"{prefix}{f.name}"
            kwargs[f.name] = build(t, data[f.name], key + ".") if dataclasses.is_dataclass(t) else _check_type(key, t, data[f.name], "")
        return cls(**kwargs)

    return build(Config, d, "")


def load_run_config(path) -> Config:
    """The resolved config a run wrote (`<run>/config.json`); ConfigError naming the file if it is unreadable."""
    path = Path(path)
    try:
        return from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not a run directory (no config.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: unreadable run config (not JSON: {str(e).splitlines()[0]})") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: bad run config ({e})") from None


def config_hash(cfg: Config) -> str:
    blob = json.dumps(to_dict(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def model_hash(cfg: Config) -> str:
    """Identity of a model's parameter shapes (a checkpoint from another model is refused): the model's
    sizes, the recipe's parameters that are present (BigramHash, SmearGate, value embeddings, the tables' storage
    dtype) and, with the n-gram bias on, the bias parameter's [orders, confidence buckets] (frontier_jax.model
    `build`). A config without them hashes its model sizes alone."""
    m, ng = cfg.model, cfg.ngram
    shapes = {k: getattr(m, k) for k in ("vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads")}
    shapes["mlp_mult"] = int(m.mlp_mult) if m.mlp_mult.is_integer() else m.mlp_mult  # an integral one as it was
    base = ModelConfig()
    for k in ("embed_dtype", "smear_gate", "bigram_buckets", "ve_layers"):  # the recipe's parameters, when present
        if getattr(m, k) != getattr(base, k):
            shapes[k] = getattr(m, k)
    if m.bigram_buckets:
        shapes["bigram_dim"] = m.bigram_dim
    if m.ve_layers:
        shapes["ve_dim"] = m.ve_dim
    if ng.bias_orders:
        shapes["ngram_bias"] = [ng.bias_orders, ng.confidence_buckets]
    return hashlib.sha256(json.dumps(shapes, sort_keys=True).encode()).hexdigest()[:12]

