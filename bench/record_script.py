"""The parameter-golf record's own `train_gpt.py` (records/track_10min_16mb/2026-03-23_LeakyReLU_LegalTTT_ParallelMuon)
run on CPU in fp32, for bench/record_parity.py. Nothing of it is in this repository: the user's copy is imported at
run time (`load`), with its CUDA-only pieces replaced by stand-ins that compute the same math:

- FlashAttention-3: the script imports `flash_attn_interface.flash_attn_func`; `load` registers a module of that
  name whose `flash_attn_func(q, k, v, causal=True)` is torch's scaled_dot_product_attention on the same
  [B, T, H, K] / [B, T, G, K] layout (causal, scale 1/sqrt(K), query head h reading kv head h // (H / G), FA3's
  grouped-query rule);
- the script's global `torch` becomes a proxy of torch whose `compile` is the identity, `autocast` a null context
  (so everything runs in fp32) and `cuda` no-ops; distributed is never initialised, so every function takes its
  single-process branch (Parallel Muon's too);
- its settings are environment variables read when the module is imported (its `Hyperparameters` class and name
  patterns): `load` sets exactly the given ones (every variable the script reads is removed first, so the rest
  take the script's defaults), imports, and puts the process environment back as it was.

`RecordTrainer` is the script's training step at world size 1 as its `main` runs it (train_gpt.py:1497-1744): its
GPT, its optimizer split (Muon on the four banks, AdamW on the three tables at the tied embedding's lr, AdamW on
everything else at the scalar lr), its loader's 8 micro-batches per step, then momentum, learning rates, clipping,
Muon (bf16), AdamW, EMA and SWA in its order. The model is held in fp32 (the script holds its three tables in bf16
and runs under bf16 autocast on a GPU); its Muon keeps its own bf16 arithmetic.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import re
import sys
import types
from pathlib import Path

import numpy as np

from frontier_jax.errors import BadInput

BANKS = ("qo_bank", "kv_bank", "mlp_up_bank", "mlp_down_bank")  # the script's Muon parameters
TABLES = ("tok_emb.weight", "bigram.embed.weight", "ve_shared.embed.weight")  # its AdamW at the tied embedding's lr
EXTRA_ENV = ("CONTROL_TENSOR_NAME_PATTERNS", "INT8_KEEP_FLOAT_FP32_NAME_PATTERNS", "RANK", "WORLD_SIZE", "LOCAL_RANK")
EMA_DECAY = 0.997  # hard-coded in the script (train_gpt.py:1637)
MICRO_STEPS = 8  # grad_accum_steps = 8 // world_size at world size 1 (train_gpt.py:1395)


def read_env_names(source: str) -> set[str]:
    """Every environment variable the script reads (its os.environ.get calls, the quantizer's name patterns and
    torchrun's)."""
    return set(re.findall(r'os\.environ\.get\(\s*"([A-Z0-9_]+)"', source)) | set(EXTRA_ENV)


def flash_attn_func(q, k, v, causal: bool = False, softmax_scale=None, **other):
    """FlashAttention-3's flash_attn_func by torch's SDPA: q [B, T, H, K], k / v [B, T, G, K] -> [B, T, H, K]."""
    import torch.nn.functional as F

    if other:
        raise NotImplementedError(f"flash_attn_func stand-in: no support for {sorted(other)}")
    q_, k_, v_ = (a.transpose(1, 2) for a in (q, k, v))
    out = F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal, scale=softmax_scale,
                                         enable_gqa=k_.shape[1] != q_.shape[1])
    return out.transpose(1, 2)


def _torch_proxy():
    """torch with compile = identity, autocast = a null context, cuda = no-ops (CPU, fp32)."""
    import torch

    proxy = types.ModuleType("torch")
    proxy.__getattr__ = lambda name: getattr(torch, name)
    proxy.compile = lambda model=None, **kw: model if model is not None else (lambda fn: fn)
    proxy.autocast = lambda *a, **kw: contextlib.nullcontext()
    proxy.cuda = types.SimpleNamespace(synchronize=lambda *a, **kw: None, is_available=lambda: False,
                                       manual_seed_all=lambda *a, **kw: None, set_device=lambda *a, **kw: None,
                                       max_memory_allocated=lambda *a, **kw: 0,
                                       max_memory_reserved=lambda *a, **kw: 0)
    return proxy


@contextlib.contextmanager
def _environment(names: set[str], values: dict[str, str]):
    saved = {k: os.environ[k] for k in names | set(values) if k in os.environ}
    try:
        for k in names:
            os.environ.pop(k, None)
        os.environ.update(values)
        yield
    finally:
        for k in names | set(values):
            os.environ.pop(k, None)
        os.environ.update(saved)


def load(path, env: dict[str, str], name: str = "pg_record_train_gpt"):
    """The script at `path` imported as module `name` with exactly `env` set (the stand-ins of the module doc).
    BadInput (one line) for a missing file or a variable the script does not read."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: the record's train_gpt.py not found")
    source = path.read_text(encoding="utf-8")
    names = read_env_names(source)
    unknown = sorted(set(env) - names)
    if unknown:
        raise BadInput(f"{path}: does not read {', '.join(unknown)} (not the record's train_gpt.py?)")
    fa = types.ModuleType("flash_attn_interface")
    fa.flash_attn_func = flash_attn_func
    sys.modules["flash_attn_interface"] = fa
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    with _environment(names, env):
        spec.loader.exec_module(mod)
    mod.torch = _torch_proxy()
    return mod


def _gpt_kwargs(args) -> dict:
    """The GPT(...) arguments of the script's main (its Hyperparameters' names)."""
    names = ("vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "tie_embeddings",
             "tied_embed_init_std", "logit_softcap", "rope_base", "qk_gain_init", "mtp_num_heads", "mtp_loss_weight",
             "bigram_vocab_size", "bigram_dim", "xsa_last_n", "rope_dims", "ln_scale", "ve_enabled", "ve_dim",
             "ve_layers", "gated_attention", "value_residual")
    return {**{n: getattr(args, n) for n in names}, "dtg": args.dtg_enabled}


def initial_state(mod) -> dict:
    """The script's initial `GPT.state_dict()` (its main: seeding, GPT, the bf16 cast, the banks, CastedLinear
    weights and low-dim / control parameters back to fp32, train_gpt.py:1434-1491), as numpy arrays."""
    import torch

    args = mod.Hyperparameters()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = mod.GPT(**_gpt_kwargs(args)).bfloat16()
    for bank in BANKS:
        getattr(model, bank).data = getattr(model, bank).data.float()
    for m in model.modules():
        if isinstance(m, mod.CastedLinear):
            m.float()
    mod.restore_low_dim_params_to_fp32(model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class RecordTrainer:
    """The script's training at world size 1 (module doc) from a state dict, in fp32."""

    def __init__(self, mod, state: dict):
        import torch

        self.mod, self.args, self.torch = mod, mod.Hyperparameters(), torch
        a = self.args
        self.model = mod.GPT(**_gpt_kwargs(a))
        self.model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
        self.model.train()
        mod.CastedLinear._qat_enabled = bool(a.qat_enabled)
        named = dict(self.model.named_parameters())
        muon = [named[k] for k in BANKS]
        tables = [named[k] for k in TABLES if k in named]
        rest = [p for k, p in named.items() if k not in BANKS and k not in TABLES]
        adam = dict(betas=(a.beta1, a.beta2), eps=a.adam_eps, weight_decay=a.adam_wd, fused=True)
        self.groups = {  # optimizer -> base lr
            torch.optim.AdamW([{"params": tables}], lr=a.tied_embed_lr, **adam): a.tied_embed_lr,
            torch.optim.AdamW([{"params": rest}], lr=a.scalar_lr, **adam): a.scalar_lr,
        }
        self.muon = mod.Muon(muon, lr=a.matrix_lr, momentum=a.muon_momentum, backend_steps=a.muon_backend_steps,
                             weight_decay=a.muon_wd)
        self.groups[self.muon] = a.matrix_lr
        self.loader = mod.DistributedTokenLoader(a.train_files, 0, 1, torch.device("cpu"))
        self.ema = {k: v.detach().float().clone() for k, v in self.model.state_dict().items()}
        self.swa_count, self.step_count = 0, 0

    def next_batches(self) -> tuple[np.ndarray, np.ndarray]:
        """The loader's 8 micro-batches of the next step as int32 [8, rows, T] (x, y)."""
        a = self.args
        xy = [self.loader.next_batch(a.train_batch_tokens, a.train_seq_len, MICRO_STEPS) for _ in range(MICRO_STEPS)]
        return (np.stack([x.numpy() for x, _ in xy]).astype(np.int32),
                np.stack([y.numpy() for _, y in xy]).astype(np.int32))

    def step(self, x_MBT, y_MBT, scale: float, momentum: float) -> tuple[float, float, bool]:
        """One optimizer step on the micro-batches at lr scale `scale` and Muon momentum `momentum`, in the
        script's order; (mean loss, gradient norm before clipping, whether late QAT was on)."""
        torch, a, opts = self.torch, self.args, list(self.groups)
        if a.late_qat_threshold > 0 and scale < a.late_qat_threshold:  # its switch (train_gpt.py:1676-1678)
            self.mod.CastedLinear._qat_enabled = True
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        total = 0.0
        for x, y in zip(x_MBT, y_MBT):
            loss = self.model(torch.from_numpy(x).long(), torch.from_numpy(y).long())
            total += float(loss.detach())
            (loss / MICRO_STEPS).backward()
        for g in self.muon.param_groups:
            g["momentum"] = momentum
        for opt, base in self.groups.items():
            for g in opt.param_groups:
                g["lr"] = base * scale
        params = list(self.model.parameters())
        norm = (torch.nn.utils.clip_grad_norm_(params, a.grad_clip_norm) if a.grad_clip_norm > 0 else
                torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
        self.muon.launch_reduce_scatters()
        for opt in opts:  # the two AdamW, then Muon (train_gpt.py:1705-1710)
            opt.step()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                self.ema[k].mul_(EMA_DECAY).add_(v.detach().float(), alpha=1.0 - EMA_DECAY)
        self.step_count += 1
        if a.swa_enabled and scale < 0.2 and self.step_count % a.swa_every == 0:
            self.swa_count += 1  # the script's SWA sum is never read; its count is what a run shows
        return total / MICRO_STEPS, float(norm), bool(self.mod.CastedLinear._qat_enabled)

    def state(self) -> dict[str, np.ndarray]:
        return {k: v.detach().float().numpy().copy() for k, v in self.model.state_dict().items()}

    def ema_state(self) -> dict[str, np.ndarray]:
        return {k: v.numpy().copy() for k, v in self.ema.items()}


def exported_state(mod, ema: dict[str, np.ndarray]) -> dict:
    """The weights the script's test-time training starts from, from its EMA `ema` (its pipeline after training,
    train_gpt.py:1762-1833): the EMA in its model's dtypes (the three tables bf16), unbanked, through its int6
    quantizer and back (`mixed_quantize_int6` / `dequantize_mixed_int6`; the file's torch.save and lzma between
    them are lossless), rebanked: a state dict of torch tensors in those dtypes."""
    import torch

    args = mod.Hyperparameters()
    sd = {k: torch.from_numpy(v).to(torch.bfloat16 if k in TABLES else torch.float32) for k, v in ema.items()}
    unbanked = mod._unbank_state_dict(sd, args.num_layers)
    q, meta = mod.mixed_quantize_int6(unbanked, {"mlp", "attn"})
    return mod._rebank_state_dict(mod.dequantize_mixed_int6(q, meta, unbanked), args.num_layers, sd)


def ttt_windows(n_targets: int, seq_len: int, stride: int, chunk_tokens: int) -> list[tuple[int, int, int]]:
    """(start, length, first scored position) of the script's TTT windows in the order it scores them (chunk by
    chunk, train_gpt.py:1087-1099, 1131-1171): tail windows re-score the last targets."""
    starts = [ws for ws in range(0, n_targets, stride) if min(ws + seq_len, n_targets) - ws >= stride or ws == 0]
    num_chunks = -(-n_targets // chunk_tokens)
    rows = []
    for ws in starts:
        wlen = min(ws + seq_len, n_targets) - ws
        s = 0 if ws == 0 else max(wlen - stride, 0)
        rows.append((min((ws + s) // chunk_tokens, num_chunks - 1), ws, wlen, s))
    return [(ws, wlen, s) for _, ws, wlen, s in sorted(rows, key=lambda r: r[0])]  # stable: the script's order


def ttt_score(mod, state: dict, tokens: np.ndarray, tokenizer, qat: bool) -> dict:
    """The script's `eval_val_sliding_ttt` (as it is, at its EVAL_STRIDE) of an fp32 GPT holding `state`, over the
    val stream `tokens`, with CastedLinear's late-QAT flag `qat` (its training forwards fake-quantize with it).
    Its scoring forwards are recorded on the way (the model's `forward_logits` wrapped; it returns the same
    logits), so besides its own (loss, bpb) the same pass gives the sums of every target scored once (a tail window
    counting only the targets no earlier window scored). Returns {"as_is": {...}, "once": {...}} with val_loss,
    val_bpb, tokens and bytes of each, the function's own val_bpb and the chunk and window counts."""
    import sentencepiece as spm
    import torch
    import torch.nn.functional as F

    args = mod.Hyperparameters()
    model = mod.GPT(**_gpt_kwargs(args))
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    base, lead, boundary = mod.build_sentencepiece_luts(sp, args.vocab_size, torch.device("cpu"))
    toks = torch.from_numpy(tokens.astype(np.int64))
    n, T = toks.numel() - 1, args.train_seq_len
    windows = ttt_windows(n, T, args.eval_stride, args.ttt_chunk_tokens)
    nll_rows, done = [], [0]
    forward = model.forward_logits
    with torch.no_grad():  # its Rotary caches cos / sin at first use: not under inference_mode, which would make
        forward(toks[None, :T])  # them inference tensors its training forwards cannot save (its bf16 .to() copies)

    def recorded(x_BT):
        logits = forward(x_BT)
        for i in range(x_BT.shape[0]):
            ws, wlen, _ = windows[done[0] + i]
            if not torch.equal(x_BT[i, :wlen], toks[ws:ws + wlen]):
                raise RuntimeError(f"the script scored window {done[0] + i} out of the expected order")
            nll_rows.append(F.cross_entropy(logits[i, :wlen].float(), toks[ws + 1:ws + wlen + 1], reduction="none"))
        done[0] += x_BT.shape[0]
        return logits

    model.forward_logits = recorded
    saved = mod.CastedLinear._qat_enabled
    mod.CastedLinear._qat_enabled = bool(qat)
    try:
        loss, score = mod.eval_val_sliding_ttt(args, model, 0, 1, torch.device("cpu"), toks, base, lead, boundary,
                                               stride=args.eval_stride, log0=lambda msg: None)
    finally:
        mod.CastedLinear._qat_enabled = saved
    if done[0] != len(windows):
        raise RuntimeError(f"the script scored {done[0]} windows, expected {len(windows)}")
    sums = {"as_is": [0.0, 0, 0], "once": [0.0, 0, 0]}
    scored_to = 0
    for (ws, wlen, s), nll in zip(windows, nll_rows):
        for key, first in (("as_is", s), ("once", max(s, scored_to - ws))):
            if first >= wlen:
                continue
            tgt, prev = toks[ws + 1 + first:ws + wlen + 1], toks[ws + first:ws + wlen]
            nbytes = base[tgt].to(torch.int64) + (lead[tgt] & ~boundary[prev]).to(torch.int64)
            acc = sums[key]
            acc[0] += float(nll[first:].to(torch.float64).sum())
            acc[1] += wlen - first
            acc[2] += int(nbytes.sum())
        scored_to = max(scored_to, ws + wlen)
    out = {key: {"val_loss": a[0] / a[1], "val_bpb": a[0] / a[1] / np.log(2.0) * a[1] / a[2], "tokens": a[1],
                 "bytes": a[2]} for key, a in sums.items()}
    return {**out, "function": {"val_loss": loss, "val_bpb": score}, "windows": len(windows),
            "chunks": -(-n // args.ttt_chunk_tokens)}
