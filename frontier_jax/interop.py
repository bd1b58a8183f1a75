"""Weights in the PyTorch baseline's `state_dict` layout, as a plain `.npz` (no torch needed).

    python -m frontier_jax.interop export --run DIR --out FILE.npz
    python -m frontier_jax.interop import --npz FILE.npz --config PATH [--set k=v]... --out DIR

Keys are exactly the baseline's parameter names (`tok_emb.weight` [V, D], `skip_weights` [S, D],
`blocks.{i}.attn.c_q.weight` [out, in], `blocks.{i}.attn.q_gain`, `blocks.{i}.resid_mix`, ...).
Linear weights are stored [in, out] in this package and [out, in] in PyTorch, so they are transposed
on the way out and back. Every array is saved as float32 (exact for bf16 values); the original dtype
of each key is recorded in the JSON string entry `__dtypes__`, and `__meta__` holds the model config.
Entries whose names start with `__` are metadata, never parameters.

`import` builds a run directory (config.json + checkpoint at step 0) whose parameters are the npz's
and whose optimizer state is freshly initialised: `python -m frontier_jax.evaluate --run DIR` scores
it; `python -m frontier_jax.train --resume DIR` would start training from these weights with a new
optimizer state and the data stream at its beginning.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from frontier_jax.config import Config, apply_overrides, load_config, load_run_config, model_hash, to_dict
from frontier_jax.data.shards import DataError
from frontier_jax.errors import exit_on_error
from frontier_jax.optim import path_names

LINEAR_NAMES = ("c_q", "c_k", "c_v", "proj", "fc")  # stored [in, out] here, [out, in] in PyTorch
META_PREFIX = "__"


class InteropError(DataError):
    """An npz that does not fit the model (missing/extra key, wrong shape, unreadable)."""


def torch_name(names: list[str]) -> tuple[str, bool]:
    """(state_dict key, transposed?) of one parameter path of ours."""
    if names == ["tok_emb"]:
        return "tok_emb.weight", False
    if names[-1] in LINEAR_NAMES and names[0] == "blocks":
        return ".".join(names) + ".weight", True
    return ".".join(names), False


def params_to_state_dict(params) -> dict[str, np.ndarray]:
    """PyTorch-named numpy arrays of `params` (an nnx.State or pytree), in their own dtype and PyTorch layout."""
    sd = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        key, transposed = torch_name(path_names(path))
        arr = np.asarray(jax.device_get(leaf))
        sd[key] = np.ascontiguousarray(arr.T) if transposed else arr
    return sd


def state_dict_to_params(sd: dict[str, np.ndarray], abstract_params, source: str = "<state_dict>"):
    """The pytree of `abstract_params` (shapes/dtypes) filled from `sd`; InteropError names `source` and the key."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_params)
    wanted = {}
    for path, leaf in flat:
        key, transposed = torch_name(path_names(path))
        wanted[key] = (leaf, transposed)
    given = {k for k in sd if not k.startswith(META_PREFIX)}
    missing = [k for k in wanted if k not in given]
    if missing:
        raise InteropError(f"{source}: missing key {missing[0]!r} ({len(missing)} missing of {len(wanted)})")
    extra = sorted(given - set(wanted))
    if extra:
        raise InteropError(f"{source}: unexpected key {extra[0]!r} ({len(extra)} not in the model)")
    leaves = []
    for path, leaf in flat:
        key, transposed = torch_name(path_names(path))
        arr = np.asarray(sd[key])
        expect = tuple(leaf.shape[::-1]) if transposed else tuple(leaf.shape)
        if arr.shape != expect:
            raise InteropError(f"{source}: key {key!r} has shape {list(arr.shape)}, the model expects {list(expect)}")
        if not jnp.issubdtype(arr.dtype, jnp.floating):
            raise InteropError(f"{source}: key {key!r} has dtype {arr.dtype}; parameters must be floating point")
        if not np.isfinite(arr.astype(np.float32)).all():
            raise InteropError(f"{source}: key {key!r} holds non-finite values (NaN or inf)")
        if transposed:
            arr = arr.T
        leaves.append(jnp.asarray(arr.astype(np.float32), dtype=leaf.dtype))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def save_npz(path, sd: dict[str, np.ndarray], meta: dict | None = None) -> None:
    """Write `sd` as float32 arrays plus `__dtypes__` (and `__meta__`) JSON entries, atomically."""
    path = Path(path)
    dtypes = {k: str(v.dtype) for k, v in sd.items()}
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in sd.items()}
    arrays["__dtypes__"] = np.array(json.dumps(dtypes, sort_keys=True))
    arrays["__meta__"] = np.array(json.dumps(meta or {}, sort_keys=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_npz(path) -> tuple[dict[str, np.ndarray], dict]:
    """(state_dict with the recorded dtypes restored, meta)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an npz archive")
            raw = {k: z[k] for k in z.files}
        dtypes = json.loads(str(raw.pop("__dtypes__"))) if "__dtypes__" in raw else {}
        meta = json.loads(str(raw.pop("__meta__"))) if "__meta__" in raw else {}
        sd = {k: v.astype(jnp.dtype(dtypes[k])) if dtypes.get(k) else v for k, v in raw.items()}
    except FileNotFoundError:
        raise InteropError(f"{path}: no such npz file") from None
    except (OSError, ValueError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as e:
        raise InteropError(f"{path}: not a readable npz ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    return sd, meta


# ----------------------------------------------------------------------------- run directories


def read_run_config(run_dir) -> tuple[Config, jnp.dtype]:
    """(resolved config, compute dtype the run trained in) of a run directory."""
    from frontier_jax.model import resolve_compute_dtype

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise DataError(f"{run_dir}: not a run directory (no config.json)")
    cfg = load_run_config(run_dir / "config.json")
    env_path = run_dir / "env.json"
    try:
        dtype = json.loads(env_path.read_text()).get("compute_dtype") if env_path.is_file() else None
        dtype = jnp.dtype(dtype) if dtype else resolve_compute_dtype(cfg.model)
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError) as e:
        raise DataError(f"{env_path}: unreadable run environment ({str(e).splitlines()[0]})") from None
    return cfg, dtype


def abstract_state(cfg: Config, compute_dtype, tx):
    """(graphdef, abstract params, abstract opt_state) built as loop.init_state does, without allocating."""
    from frontier_jax.model import GPT
    orders = cfg.ngram.num_orders if cfg.ngram.enabled else 0
    model = nnx.eval_shape(lambda: GPT(cfg.model, rngs=nnx.Rngs(cfg.train.seed), compute_dtype=compute_dtype,
                                       num_bias_orders=orders, bias_buckets=cfg.ngram.confidence_buckets))
    graphdef, params = nnx.split(model)
    return graphdef, params, jax.eval_shape(tx.init, params)


def restore_params(run_dir, step: int | None = None):
    """(config, graphdef, params, step, compute dtype) from a run's latest (or given) checkpoint."""
    from frontier_jax import checkpoint, optim

    cfg, dtype = read_run_config(run_dir)
    graphdef, aparams, aopt = abstract_state(cfg, dtype, optim.build_optimizer(cfg.optim))
    step = checkpoint.latest_step(run_dir) if step is None else step
    if step is None:
        raise checkpoint.CheckpointError(f"{run_dir}: no checkpoint found (expected {run_dir}/checkpoints/<step>/)")
    state, _ = checkpoint.restore(Path(run_dir), {"params": aparams, "opt_state": aopt}, step=step,
                                  expect_model_hash=model_hash(cfg.model))
    return cfg, graphdef, state["params"], step, dtype


def export_run(run_dir, out) -> dict:
    cfg, _, params, step, dtype = restore_params(Path(run_dir))
    sd = params_to_state_dict(params)
    save_npz(out, sd, {"model": to_dict(cfg)["model"], "step": step, "source_run": str(run_dir),
                       "compute_dtype": str(dtype)})
    return {"keys": len(sd), "params": int(sum(v.size for v in sd.values())), "step": step, "out": str(out)}


def import_run(npz, cfg: Config, out_dir) -> dict:
    """A new run directory holding the npz's parameters (fresh optimizer state) as checkpoint 0."""
    from frontier_jax import checkpoint, optim, report
    from frontier_jax.run_support import prepare_run_dir
    from frontier_jax.model import resolve_compute_dtype

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        raise DataError(f"{out_dir}: already holds a run; choose a new --out")
    sd, meta = load_npz(npz)
    dtype = resolve_compute_dtype(cfg.model)
    tx = optim.build_optimizer(cfg.optim)
    _, aparams, _ = abstract_state(cfg, dtype, tx)
    params = state_dict_to_params(sd, aparams, source=str(npz))  # checked before anything is written
    prepare_run_dir(out_dir, resume=False)
    report.write_json(out_dir / "config.json", to_dict(cfg))
    report.write_json(out_dir / "env.json", {**report.environment(), "compute_dtype": str(dtype),
                                             "imported_from": str(npz), "imported_meta": meta})
    ckpt_meta = {"step": 0, "train_seconds": 0.0, "tokens": 0, "data": {"shard": 0, "offset": 0, "position_tokens": 0},
                 "model_hash": model_hash(cfg.model), "model": to_dict(cfg)["model"], "reason": f"imported {npz}"}
    checkpoint.save(out_dir, 0, {"params": params, "opt_state": tx.init(params)}, ckpt_meta)
    return {"keys": len(sd), "out": str(out_dir), "step": 0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m frontier_jax.interop", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="a run's latest checkpoint -> npz in PyTorch state_dict layout")
    ex.add_argument("--run", required=True)
    ex.add_argument("--out", required=True)
    im = sub.add_parser("import", help="npz in PyTorch state_dict layout -> a new run directory")
    im.add_argument("--npz", required=True)
    im.add_argument("--config", required=True, help="a configs/*.py file describing the model")
    im.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    im.add_argument("--out", required=True)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    with exit_on_error():
        if args.cmd == "export":
            r = export_run(args.run, args.out)
            print(f"exported {r['keys']} arrays ({r['params']:,} parameters) from step {r['step']} -> {r['out']}")
        else:
            cfg = apply_overrides(load_config(args.config), args.set)
            r = import_run(args.npz, cfg, args.out)
            print(f"imported {r['keys']} arrays -> {r['out']} (checkpoint step 0, fresh optimizer state)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
