"""The parameter-golf record's formats (records/track_10min_16mb/2026-03-23_LeakyReLU_LegalTTT_ParallelMuon,
docs/recipe.md), with numpy alone: its state dict's names, order, shapes and dtypes, banked (`GPT.state_dict()`,
what its `final_model.pt` holds) and unbanked (the per-layer names its int6 artifact quantizes), the banking
between the two, and its script's environment (`record.env`, `KEY=VALUE` lines) to and from our config.

Our parameters map 1:1 to the unbanked names (`frontier_jax.interop.state_dict.params_to_state_dict`: the
baseline's names, `blocks.{i}.attn.c_q.weight` [out, in], ..., plus `bigram.*`, `smear.gate`, `ve_shared.*`,
`ve_layer_scales.{k}`). The record keeps its per-layer matrices in four banks (train_gpt.py:819-827):
`qo_bank` [2L, D, D] (c_q of layer i at i, attn.proj at L + i), `kv_bank` [2L, G K, D] (c_k at i, c_v at L + i),
`mlp_up_bank` [L, F, D] (fc), `mlp_down_bank` [L, D, F] (mlp.proj). Orders are torch's `state_dict` order for
the record's modules (its own parameters, then submodules in registration order) and the order its
`_unbank_state_dict` (train_gpt.py:1263-1284) writes. The record holds `tok_emb.weight`, `bigram.embed.weight`
and `ve_shared.embed.weight` in bfloat16 and everything else in float32 (train_gpt.py:1482-1491).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from frontier_jax.config import Config, ConfigError, EvalConfig, ModelConfig, OptimConfig, TrainConfig, TTTConfig
from frontier_jax.data.files import read_regular

BANKS = ("qo_bank", "kv_bank", "mlp_up_bank", "mlp_down_bank")
BF16_KEYS = ("tok_emb.weight", "bigram.embed.weight", "ve_shared.embed.weight")  # the record's bf16 parameters
BLOCK_CONTROLS = ("attn_scale", "mlp_scale", "resid_mix", "attn.q_gain")  # per block, in the record's order

# What the record's script hard-codes and our config sets (a config with another value is refused)
RECORD_NEGATIVE_SLOPE = 0.5  # F.leaky_relu(..., negative_slope=0.5), train_gpt.py:729
RECORD_ROPE_RESCALE_FROM = 1024  # Rotary(..., train_seq_len=1024), train_gpt.py:626, 850
# its optimizer and averaging: bf16 gradient copy, momentum and Newton-Schulz with the shape scale in the learning
# rate (train_gpt.py:104-266), EMA 0.997 always on (1636-1637), SWA below lr scale 0.2 (1718)
RECORD_OPTIM = {"muon_ns_dtype": "bfloat16", "muon_momentum_dtype": "bfloat16", "muon_shape_scale": "lr",
                "ema_decay": 0.997, "swa_threshold": 0.2}

# Every variable the record's script reads, with its default (train_gpt.py:28-100; its Hyperparameters class).
RECORD_ENV_DEFAULTS = {
    "DATA_PATH": "./data/datasets/fineweb10B_sp1024", "TOKENIZER_PATH": "./data/tokenizers/fineweb_1024_bpe.model",
    "RUN_ID": "", "SEED": "1337", "VAL_BATCH_SIZE": "524288", "VAL_LOSS_EVERY": "4000", "TRAIN_LOG_EVERY": "500",
    "ITERATIONS": "20000", "WARMDOWN_ITERS": "3500", "WARMUP_STEPS": "20", "TRAIN_BATCH_TOKENS": "786432",
    "TRAIN_SEQ_LEN": "2048", "EVAL_SEQ_LEN": "2048", "MAX_WALLCLOCK_SECONDS": "600.0", "QK_GAIN_INIT": "1.5",
    "VOCAB_SIZE": "1024", "NUM_LAYERS": "11", "NUM_KV_HEADS": "4", "MODEL_DIM": "512", "NUM_HEADS": "8",
    "MLP_MULT": "3.0", "TIE_EMBEDDINGS": "1", "ROPE_BASE": "10000.0", "LOGIT_SOFTCAP": "30.0", "EMBED_LR": "0.6",
    "HEAD_LR": "0.008", "TIED_EMBED_LR": "0.035", "TIED_EMBED_INIT_STD": "0.005", "MATRIX_LR": "0.025",
    "SCALAR_LR": "0.025", "MUON_MOMENTUM": "0.99", "MUON_BACKEND_STEPS": "5", "MUON_MOMENTUM_WARMUP_START": "0.92",
    "MUON_MOMENTUM_WARMUP_STEPS": "1500", "BETA1": "0.9", "BETA2": "0.95", "ADAM_EPS": "1e-8",
    "GRAD_CLIP_NORM": "0.3", "EVAL_STRIDE": "64", "MTP_NUM_HEADS": "0", "MTP_LOSS_WEIGHT": "0.2",
    "MUON_BETA2": "0.95", "SWA_ENABLED": "1", "SWA_EVERY": "50", "LAWA_ENABLED": "0", "LAWA_K": "10",
    "LAWA_FREQ": "100", "MUON_WD": "0.04", "ADAM_WD": "0.04", "QAT_ENABLED": "0", "BIGRAM_VOCAB_SIZE": "2048",
    "BIGRAM_DIM": "128", "XSA_LAST_N": "4", "ROPE_DIMS": "16", "LN_SCALE": "1", "DTG_ENABLED": "0",
    "LATE_QAT_THRESHOLD": "0.15", "VE_ENABLED": "1", "VE_DIM": "128", "VE_LAYERS": "9,10", "GATED_ATTENTION": "0",
    "VALUE_RESIDUAL": "0", "TTT_ENABLED": "0", "TTT_LR": "0.002", "TTT_EPOCHS": "3", "TTT_CHUNK_TOKENS": "32768",
    "TTT_FREEZE_BLOCKS": "2", "TTT_MOMENTUM": "0.9", "TTT_BATCH_SEQS": "32", "TTT_GRAD_CLIP": "1.0",
    "CONTROL_TENSOR_NAME_PATTERNS": "", "INT8_KEEP_FLOAT_FP32_NAME_PATTERNS": "",
}
# Settings of the record's model that our model does not have: only their off value is accepted
RECORD_OFF_SWITCHES = {"TIE_EMBEDDINGS": "1", "MTP_NUM_HEADS": "0", "DTG_ENABLED": "0", "GATED_ATTENTION": "0",
                       "VALUE_RESIDUAL": "0"}


class RecordFormatError(ConfigError):
    """A config, state dict or environment the record's format cannot hold (one line naming the setting)."""


# ----------------------------------------------------------------------------- names, orders, dtypes


def _unbanked_matrices(L: int) -> list[str]:
    """The per-layer matrices in the order the record's `_unbank_state_dict` writes them."""
    names = []
    for group in (("attn.c_q", "attn.proj"), ("attn.c_k", "attn.c_v"), ("mlp.fc",), ("mlp.proj",)):
        names += [f"blocks.{i}.{n}.weight" for i in range(L) for n in group]
    return names


def _tail(m: ModelConfig) -> list[str]:
    """The keys after the matrices: the embedding, BigramHash, SmearGate, block controls, value embeddings."""
    names = ["tok_emb.weight"]
    if m.bigram_buckets:
        names += ["bigram.scale", "bigram.embed.weight"] + (["bigram.proj.weight"] if m.bigram_dim != m.model_dim else [])
    if m.smear_gate:
        names += ["smear.gate"]
    names += [f"blocks.{i}.{n}" for i in range(m.num_layers) for n in BLOCK_CONTROLS]
    if m.ve_layers:
        kv = m.num_kv_heads * m.head_dim
        names += ["ve_shared.scale", "ve_shared.embed.weight"] + (["ve_shared.proj.weight"] if m.ve_dim != kv else [])
        names += [f"ve_layer_scales.{k}" for k in range(len(m.ve_layers))]
    return names


def unbanked_names(m: ModelConfig) -> list[str]:
    """The record's unbanked state dict keys in its order (train_gpt.py:1263-1284): the artifact's tensors."""
    return ["skip_weights"] + _unbanked_matrices(m.num_layers) + _tail(m)


def banked_names(m: ModelConfig) -> list[str]:
    """The record's `GPT.state_dict()` keys in its order (SPEC: GPT's own parameters, then its submodules)."""
    return ["skip_weights", *BANKS] + _tail(m)


def record_dtype(name: str) -> np.dtype:
    """The dtype the record holds parameter `name` in: bfloat16 for the three tables, float32 otherwise."""
    if name in BF16_KEYS:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float32)


def unbanked_state_dict(sd: dict[str, np.ndarray], m: ModelConfig, source: str = "<state_dict>") -> dict:
    """`sd` (our parameters in the record's unbanked names, e.g. `state_dict.params_to_state_dict`) in the record's
    unbanked order and dtypes. A bf16 key whose values bf16 does not hold exactly is refused (the record stores it
    bf16: rounding it would change the model); so is a missing or extra key."""
    names = unbanked_names(m)
    missing, extra = [k for k in names if k not in sd], sorted(set(sd) - set(names))
    if missing or extra:
        what = f"missing key {missing[0]!r}" if missing else f"key {extra[0]!r} has no place in the record's model"
        raise RecordFormatError(f"{source}: {what}")
    out = {}
    for k in names:
        a, dt = np.asarray(sd[k]), record_dtype(k)
        cast = a.astype(dt)
        if not np.array_equal(cast.astype(np.float32), a.astype(np.float32)):
            raise RecordFormatError(f"{source}: {k} holds {a.dtype} values that {dt} does not hold exactly (the "
                                    "record stores it in bfloat16): train with model.embed_dtype=\"bfloat16\"")
        out[k] = cast
    return out


def bank(unbanked: dict[str, np.ndarray], m: ModelConfig) -> dict[str, np.ndarray]:
    """The record's `GPT.state_dict()` (banked, its order) from its unbanked state dict (`unbanked_state_dict`)."""
    L = m.num_layers
    stack = lambda fmt, layers: np.stack([unbanked[fmt.format(i=i % L)] for i in layers]).astype(np.float32)
    banks = {
        "qo_bank": np.concatenate([stack("blocks.{i}.attn.c_q.weight", range(L)),
                                   stack("blocks.{i}.attn.proj.weight", range(L))]),
        "kv_bank": np.concatenate([stack("blocks.{i}.attn.c_k.weight", range(L)),
                                   stack("blocks.{i}.attn.c_v.weight", range(L))]),
        "mlp_up_bank": stack("blocks.{i}.mlp.fc.weight", range(L)),
        "mlp_down_bank": stack("blocks.{i}.mlp.proj.weight", range(L)),
    }
    return {k: banks[k] if k in banks else unbanked[k] for k in banked_names(m)}


def unbank(banked: dict[str, np.ndarray], m: ModelConfig) -> dict[str, np.ndarray]:
    """The record's unbanked state dict (its order) from its `GPT.state_dict()` (`bank`'s inverse)."""
    L = m.num_layers
    slices = {}
    for i in range(L):
        slices[f"blocks.{i}.attn.c_q.weight"], slices[f"blocks.{i}.attn.proj.weight"] = (
            banked["qo_bank"][i], banked["qo_bank"][L + i])
        slices[f"blocks.{i}.attn.c_k.weight"], slices[f"blocks.{i}.attn.c_v.weight"] = (
            banked["kv_bank"][i], banked["kv_bank"][L + i])
        slices[f"blocks.{i}.mlp.fc.weight"] = banked["mlp_up_bank"][i]
        slices[f"blocks.{i}.mlp.proj.weight"] = banked["mlp_down_bank"][i]
    return {k: np.ascontiguousarray(slices[k]) if k in slices else banked[k] for k in unbanked_names(m)}


def banked_shapes(m: ModelConfig) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{key: (shape, dtype)} of the record's `GPT.state_dict()` for model `m`, in its order."""
    L, D, H, G, K, F = m.num_layers, m.model_dim, m.num_heads, m.num_kv_heads, m.head_dim, m.mlp_hidden
    shapes = {"skip_weights": (min(L // 2, L - L // 2), D), "qo_bank": (2 * L, D, D), "kv_bank": (2 * L, G * K, D),
              "mlp_up_bank": (L, F, D), "mlp_down_bank": (L, D, F), "tok_emb.weight": (m.vocab_size, D),
              "bigram.scale": (), "bigram.embed.weight": (m.bigram_buckets, m.bigram_dim),
              "bigram.proj.weight": (D, m.bigram_dim), "smear.gate": (D,), "ve_shared.scale": (),
              "ve_shared.embed.weight": (m.vocab_size, m.ve_dim), "ve_shared.proj.weight": (G * K, m.ve_dim)}
    for i in range(L):
        shapes.update({f"blocks.{i}.attn_scale": (D,), f"blocks.{i}.mlp_scale": (D,), f"blocks.{i}.resid_mix": (2, D),
                       f"blocks.{i}.attn.q_gain": (H,)})
    for k in range(len(m.ve_layers)):
        shapes[f"ve_layer_scales.{k}"] = (1,)
    return {k: (shapes[k], record_dtype(k)) for k in banked_names(m)}


# ----------------------------------------------------------------------------- the script's environment


def expressible(cfg: Config) -> None:
    """Raise RecordFormatError (one line naming the setting) when the record's script cannot build `cfg`'s model."""
    m = cfg.model
    fixed = (("smear_gate", True, "its SmearGate is always on (train_gpt.py:913)"),
             ("mlp_negative_slope", RECORD_NEGATIVE_SLOPE, "its MLP is LeakyReLU(0.5)^2 (train_gpt.py:729)"),
             ("rope_rescale_from", RECORD_ROPE_RESCALE_FROM,
              "its rotary rescales the base from length 1024 (train_gpt.py:626, 850)"))
    for field, value, why in fixed:
        if getattr(m, field) != value:
            raise RecordFormatError(f"model.{field}={getattr(m, field)!r}: the record's script cannot express it "
                                    f"(it needs {value!r}: {why})")
    if cfg.ngram.enabled:
        raise RecordFormatError("ngram.enabled=True: the record's script has no n-gram logit bias")
    if cfg.ttt.enabled and cfg.ttt.freeze_blocks:
        raise RecordFormatError(f"ttt.freeze_blocks={cfg.ttt.freeze_blocks}: the record's TTT_FREEZE_BLOCKS freezes "
                                "only its blocks' control tensors (its matrices are banks outside blocks.*), not "
                                "whole blocks")


def record_env(cfg: Config) -> dict[str, str]:
    """The record script's environment that builds `cfg`'s model and evaluation, its test-time training included
    (`expressible` first)."""
    expressible(cfg)
    m, t = cfg.model, cfg.train
    return {**{key: _TTT_OUT[key](getattr(cfg.ttt, field)) for key, (field, _) in _TTT.items()},
        "NUM_LAYERS": str(m.num_layers), "MODEL_DIM": str(m.model_dim), "NUM_HEADS": str(m.num_heads),
        "NUM_KV_HEADS": str(m.num_kv_heads), "MLP_MULT": repr(m.mlp_mult),
        "BIGRAM_VOCAB_SIZE": str(m.bigram_buckets), "BIGRAM_DIM": str(m.bigram_dim),
        "XSA_LAST_N": str(m.xsa_last_n), "ROPE_DIMS": str(m.rope_dims), "LN_SCALE": str(int(m.ln_scale)),
        "VE_ENABLED": str(int(bool(m.ve_layers))), "VE_DIM": str(m.ve_dim),
        "VE_LAYERS": ",".join(str(i) for i in m.ve_layers), "TRAIN_SEQ_LEN": str(t.seq_len),
        "EVAL_SEQ_LEN": str(cfg.eval_seq_len), "EVAL_STRIDE": str(cfg.eval.stride), "VOCAB_SIZE": str(m.vocab_size),
        "LOGIT_SOFTCAP": repr(m.logit_softcap), "QK_GAIN_INIT": repr(m.qk_gain_init), "ROPE_BASE": repr(m.rope_base),
        "TIE_EMBEDDINGS": "1", "TIED_EMBED_INIT_STD": repr(m.tied_embed_init_std),
        "MTP_NUM_HEADS": "0", "DTG_ENABLED": "0", "GATED_ATTENTION": "0", "VALUE_RESIDUAL": "0",
    }


def record_training_env(cfg: Config) -> dict[str, str]:
    """The record script's environment for `cfg`'s optimizer, averaging and schedule (its learning rates, momentum
    warm-up, weight decay, clipping, SWA, late QAT, batch, steps, warmdown, clock and seed), beside `record_env`'s
    model. What the script hard-codes (`RECORD_OPTIM`: bf16 Muon momentum and Newton-Schulz, the shape scale in the
    learning rate, EMA 0.997, SWA below lr scale 0.2) must be the config's: anything else is refused in one line."""
    o, t = cfg.optim, cfg.train
    for field, value in RECORD_OPTIM.items():
        if getattr(o, field) != value:
            raise RecordFormatError(f"optim.{field}={getattr(o, field)!r}: the record's script cannot express it "
                                    f"(it hard-codes {value!r})")
    steps = o.warmdown_mode == "steps"
    if not steps and not math.isfinite(t.budget_seconds):
        raise RecordFormatError("train.budget_seconds=inf with optim.warmdown_mode='time': the record's script has "
                                "no time-based warmdown without a clock (MAX_WALLCLOCK_SECONDS=0 warms down by steps)")
    return {
        "MATRIX_LR": repr(o.matrix_lr), "SCALAR_LR": repr(o.scalar_lr), "TIED_EMBED_LR": repr(o.embed_lr),
        "BETA1": repr(o.beta1), "BETA2": repr(o.beta2), "ADAM_EPS": repr(o.adam_eps),
        "MUON_MOMENTUM": repr(o.muon_momentum), "MUON_MOMENTUM_WARMUP_START": repr(o.muon_momentum_warmup_start),
        "MUON_MOMENTUM_WARMUP_STEPS": str(o.muon_momentum_warmup_steps), "MUON_BACKEND_STEPS": str(o.muon_ns_steps),
        "MUON_WD": repr(o.muon_weight_decay), "ADAM_WD": repr(o.adam_weight_decay),
        "GRAD_CLIP_NORM": repr(o.grad_clip_norm), "SWA_ENABLED": str(int(bool(o.swa_every))),
        "SWA_EVERY": str(o.swa_every or 1), "QAT_ENABLED": str(int(o.late_qat_threshold == math.inf)),
        "LATE_QAT_THRESHOLD": repr(o.late_qat_threshold if math.isfinite(o.late_qat_threshold) else 0.0),
        "WARMDOWN_ITERS": str(o.warmdown_steps), "ITERATIONS": str(t.max_steps),
        "MAX_WALLCLOCK_SECONDS": "0" if steps else repr(t.budget_seconds), "TRAIN_BATCH_TOKENS": str(t.tokens_per_step),
        "WARMUP_STEPS": str(t.compile_warmup_steps), "SEED": str(t.seed),
    }


def format_env(env: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in env.items())


def read_env(path) -> dict[str, str]:
    """`KEY=VALUE` lines (`#` comments, blank lines and an `export ` prefix allowed); RecordFormatError naming the
    file and line for anything else or for a variable the record's script does not read."""
    path = Path(path)
    try:
        text = read_regular(path, "the record's environment", max_bytes=1 << 20).decode("utf-8")
    except FileNotFoundError:
        raise RecordFormatError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordFormatError(f"{path}: unreadable ({type(e).__name__})") from None
    env = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        key = key.strip()
        if not sep or not key:
            raise RecordFormatError(f"{path}:{n}: expected KEY=VALUE, got {line[:60]!r}")
        if key not in RECORD_ENV_DEFAULTS:
            raise RecordFormatError(f"{path}:{n}: {key} is not a variable the record's script reads")
        env[key] = value.strip()
    return env


# env variable -> (section, field, parse) for the settings our config has
def _int(s: str) -> int:
    return int(s)


def _bool(s: str) -> bool:
    return bool(int(s))


_MODEL = {"VOCAB_SIZE": ("vocab_size", _int), "NUM_LAYERS": ("num_layers", _int), "MODEL_DIM": ("model_dim", _int),
          "NUM_HEADS": ("num_heads", _int), "NUM_KV_HEADS": ("num_kv_heads", _int), "MLP_MULT": ("mlp_mult", float),
          "ROPE_BASE": ("rope_base", float), "LOGIT_SOFTCAP": ("logit_softcap", float),
          "QK_GAIN_INIT": ("qk_gain_init", float), "TIED_EMBED_INIT_STD": ("tied_embed_init_std", float),
          "BIGRAM_VOCAB_SIZE": ("bigram_buckets", _int), "BIGRAM_DIM": ("bigram_dim", _int),
          "XSA_LAST_N": ("xsa_last_n", _int), "ROPE_DIMS": ("rope_dims", _int), "LN_SCALE": ("ln_scale", _bool),
          "VE_DIM": ("ve_dim", _int)}
_OPTIM = {"MATRIX_LR": ("matrix_lr", float), "SCALAR_LR": ("scalar_lr", float), "TIED_EMBED_LR": ("embed_lr", float),
          "BETA1": ("beta1", float), "BETA2": ("beta2", float), "ADAM_EPS": ("adam_eps", float),
          "MUON_MOMENTUM": ("muon_momentum", float), "MUON_MOMENTUM_WARMUP_START": ("muon_momentum_warmup_start", float),
          "MUON_MOMENTUM_WARMUP_STEPS": ("muon_momentum_warmup_steps", _int),
          "MUON_BACKEND_STEPS": ("muon_ns_steps", _int), "WARMDOWN_ITERS": ("warmdown_steps", _int),
          "MUON_WD": ("muon_weight_decay", float), "ADAM_WD": ("adam_weight_decay", float),
          "GRAD_CLIP_NORM": ("grad_clip_norm", float)}
_TRAIN = {"TRAIN_SEQ_LEN": ("seq_len", _int), "TRAIN_BATCH_TOKENS": ("tokens_per_step", _int),
          "ITERATIONS": ("max_steps", _int), "SEED": ("seed", _int), "WARMUP_STEPS": ("compile_warmup_steps", _int),
          "VAL_LOSS_EVERY": ("val_every_steps", _int), "TRAIN_LOG_EVERY": ("log_every_steps", _int)}
# read by the record but settings of its data paths, its logging, its untied head, its dead code, or of what our
# config does not have (LAWA); the import lists them
_NOT_APPLIED = ("DATA_PATH", "TOKENIZER_PATH", "RUN_ID", "VAL_BATCH_SIZE", "EMBED_LR", "HEAD_LR", "MTP_LOSS_WEIGHT",
                "MUON_BETA2", "LAWA_ENABLED", "LAWA_K", "LAWA_FREQ",
                "CONTROL_TENSOR_NAME_PATTERNS", "INT8_KEEP_FLOAT_FP32_NAME_PATTERNS")
# the record's TTT variables (train_gpt.py:93-100) -> the ttt section's fields, and how each is written back
_TTT = {"TTT_ENABLED": ("enabled", _bool), "TTT_LR": ("lr", float), "TTT_EPOCHS": ("epochs", _int),
        "TTT_CHUNK_TOKENS": ("chunk_tokens", _int), "TTT_FREEZE_BLOCKS": ("freeze_blocks", _int),
        "TTT_MOMENTUM": ("momentum", float), "TTT_BATCH_SEQS": ("batch_seqs", _int),
        "TTT_GRAD_CLIP": ("grad_clip", float)}
_TTT_OUT = {k: (lambda v: str(int(v))) if parse in (_bool, _int) else repr for k, (_, parse) in _TTT.items()}


def config_from_env(env: dict[str, str], source: str = "record.env") -> tuple[Config, list[str]]:
    """(the config of the model and training the record's script builds from `env`, the variables set in `env`
    that it does not apply). A variable not set takes the script's default; the record's hard-coded model
    (SmearGate, LeakyReLU(0.5)^2, rotary rescaled from 1024, bf16 tables, its initialisation) and optimizer
    (`RECORD_OPTIM`: bf16 Muon momentum, the shape scale in the lr, EMA 0.997, SWA below lr scale 0.2) are the
    config's. A
    setting our model does not have (untied head, MTP, DTG, gated attention, value residual) is refused."""
    full = {**RECORD_ENV_DEFAULTS, **env}
    for key, off in RECORD_OFF_SWITCHES.items():
        if full[key].strip() not in (off, f"{off}.0"):
            raise RecordFormatError(f"{source}: {key}={full[key]}: a setting of the record's model this model "
                                    f"does not have (only {key}={off})")
    sections = {}
    try:
        for table, name in ((_MODEL, "model"), (_OPTIM, "optim"), (_TRAIN, "train")):
            sections[name] = {field: parse(full[key]) for key, (field, parse) in table.items()}
        ve_layers = tuple(int(x) for x in full["VE_LAYERS"].split(",") if x.strip()) if _bool(full["VE_ENABLED"]) else ()
        wallclock = float(full["MAX_WALLCLOCK_SECONDS"])
        # SWA every SWA_EVERY steps when enabled; QAT_ENABLED=1 fake-quantizes from the first step (threshold inf)
        sections["optim"]["swa_every"] = _int(full["SWA_EVERY"]) if _bool(full["SWA_ENABLED"]) else 0
        sections["optim"]["late_qat_threshold"] = math.inf if _bool(full["QAT_ENABLED"]) else max(
            0.0, float(full["LATE_QAT_THRESHOLD"]))  # (<= 0: off in the script)
    except ValueError as e:
        raise RecordFormatError(f"{source}: unreadable value ({e})") from None
    try:
        model = ModelConfig(**sections["model"], ve_layers=ve_layers, mlp_negative_slope=RECORD_NEGATIVE_SLOPE,
                            rope_rescale_from=RECORD_ROPE_RESCALE_FROM, smear_gate=True, embed_dtype="bfloat16",
                            init="record")
        optim = OptimConfig(**sections["optim"], **RECORD_OPTIM, warmdown_mode="time" if wallclock > 0 else "steps")
        train = TrainConfig(**sections["train"], budget_seconds=wallclock if wallclock > 0 else math.inf)
        ttt = _ttt_from_env(full)
        evaluation = _eval_from_env(full, train.seq_len, ttt.enabled)
        cfg = Config(name="pg-record", model=model, optim=optim, train=train, eval=evaluation, ttt=ttt)
    except (ConfigError, ValueError) as e:
        raise RecordFormatError(f"{source}: {e}") from None
    ignored = [k for k in env if k in _NOT_APPLIED]
    return cfg, ignored


def _eval_from_env(full: dict[str, str], train_seq_len: int, ttt: bool) -> EvalConfig:
    """The record's final evaluation as the eval section: its int6 + lzma artifact, the round trip at EVAL_SEQ_LEN
    (<= 0: TRAIN_SEQ_LEN), sliding windows at EVAL_STRIDE when 0 < stride < that length (the record's condition,
    train_gpt.py L1849-1865); the score its last line: legal_ttt with TTT, else the sliding line when there is one."""
    seq_len = _int(full["EVAL_SEQ_LEN"])
    seq_len = seq_len if seq_len > 0 and seq_len != train_seq_len else 0
    stride = _int(full["EVAL_STRIDE"])
    stride = stride if 0 < stride < (seq_len or train_seq_len) else 0
    score = "ttt" if ttt else "sliding" if stride else "roundtrip"
    return EvalConfig(seq_len=seq_len, stride=stride, artifact="int6_lzma", score=score)


def _ttt_from_env(full: dict[str, str]) -> TTTConfig:
    """The record's TTT variables as the ttt section. With TTT on, a TTT_FREEZE_BLOCKS > 0 is refused: the record's
    freeze reaches only its blocks' control tensors (SPEC Q14), ttt.freeze_blocks whole blocks; with TTT off it has
    no effect and is not kept."""
    ttt = TTTConfig(**{field: parse(full[key]) for key, (field, parse) in _TTT.items()})
    if not ttt.enabled:
        return TTTConfig(**{**dataclasses.asdict(ttt), "freeze_blocks": 0})
    if ttt.freeze_blocks:
        raise RecordFormatError(f"TTT_FREEZE_BLOCKS={ttt.freeze_blocks}: the record freezes only those "
                                "blocks' control tensors (its matrices are banks outside blocks.*), ttt.freeze_blocks "
                                "whole blocks: not the same training (TTT_FREEZE_BLOCKS=0, as the record's run)")
    return ttt
