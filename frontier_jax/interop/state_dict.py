"""Weights in the PyTorch baseline's `state_dict` layout, as a plain `.npz` (no torch needed).

    python -m frontier_jax.interop export --run DIR --out FILE.npz
    python -m frontier_jax.interop import --npz FILE.npz --config PATH [--set k=v]... --out DIR

Keys are exactly the baseline's parameter names (`tok_emb.weight` [V, D], `skip_weights` [S, D],
`blocks.{i}.attn.c_q.weight` [out, in], `blocks.{i}.attn.q_gain`, `blocks.{i}.resid_mix`, ...).
Linear weights are stored [in, out] in this package and [out, in] in PyTorch, so they are transposed
on the way out and back. Every array is saved as float32 (exact for bf16 values); the original dtype
of each key is recorded in the JSON string entry `__dtypes__`, and `__meta__` holds the model config.
Entries whose names start with `__` are metadata, never parameters. JAX is imported only by the
functions that need it, so `--help` answers at once.

`import` builds a run directory (config.json + checkpoint at step 0) whose parameters are the npz's
and whose optimizer state is freshly initialised: `python -m frontier_jax.evaluate --run DIR` scores
it; `python -m frontier_jax.train --resume DIR` would start training from these weights with a new
optimizer state and the data stream at its beginning.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from frontier_jax.config import Config, apply_overrides, load_config, model_hash, to_dict
from frontier_jax.data.shards import DataError
from frontier_jax.errors import exit_on_error
from frontier_jax.interop.npz import WeightsError, load_npz, save_npz
from frontier_jax.policies.dtypes import Dtypes
from frontier_jax.policies.dtypes import resolve as resolve_dtypes
from frontier_jax.run import rundir

LINEAR_NAMES = ("c_q", "c_k", "c_v", "proj", "fc")  # stored [in, out] here, [out, in] in PyTorch
META_PREFIX = "__"


InteropError = WeightsError  # an npz that does not fit the model or cannot be read


def torch_name(names: list[str]) -> tuple[str, bool]:
    """(state_dict key, transposed?) of one parameter path of ours."""
    if names == ["tok_emb"]:
        return "tok_emb.weight", False
    if names[-1] in LINEAR_NAMES and names[0] == "blocks":
        return ".".join(names) + ".weight", True
    return ".".join(names), False


def params_to_state_dict(params) -> dict[str, np.ndarray]:
    """PyTorch-named numpy arrays of `params` (an nnx.State or pytree), in their own dtype and PyTorch layout."""
    import jax

    from frontier_jax.optim import path_names

    sd = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        key, transposed = torch_name(path_names(path))
        arr = np.asarray(jax.device_get(leaf))
        sd[key] = np.ascontiguousarray(arr.T) if transposed else arr
    return sd


def expected_shapes(abstract_params) -> dict[str, tuple]:
    """{state_dict key: PyTorch-layout shape} of a model's parameters (what an npz must hold)."""
    import jax

    from frontier_jax.optim import path_names

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
        key, transposed = torch_name(path_names(path))
        out[key] = tuple(leaf.shape[::-1]) if transposed else tuple(leaf.shape)
    return out


def state_dict_to_params(sd: dict[str, np.ndarray], abstract_params, source: str = "<state_dict>"):
    """The pytree of `abstract_params` (shapes/dtypes) filled from `sd`; InteropError names `source` and the key."""
    import jax
    import jax.numpy as jnp

    from frontier_jax.optim import path_names

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


# ----------------------------------------------------------------------------- run directories


def read_run_config(run_dir) -> tuple[Config, Dtypes]:
    """(resolved config, the dtypes the run trained in) of a run directory: env.json's, else the dtype policy
    on JAX's backend (`policies.dtypes.resolve`)."""
    import jax
    import jax.numpy as jnp

    cfg = rundir.read_config(run_dir)
    env = rundir.read_env(run_dir)
    recorded = env.get("compute_dtype"), env.get("muon_ns_dtype")
    # the policy only where env.json does not say (it starts JAX's backend: after the allocator is tuned)
    policy = Dtypes(*recorded) if all(recorded) else resolve_dtypes(cfg, jax.default_backend())
    try:
        return cfg, Dtypes(compute=jnp.dtype(recorded[0] or policy.compute).name,
                           muon_ns=jnp.dtype(recorded[1] or policy.muon_ns).name)
    except TypeError as e:
        raise DataError(f"{Path(run_dir) / rundir.ENV}: unreadable run environment ({e})") from None


def abstract_state(cfg: Config, compute_dtype, tx):
    """(graphdef, abstract params, abstract opt_state) built as trainer.init_state does, without allocating."""
    import jax
    from flax import nnx

    from frontier_jax.model import build

    graphdef, params = nnx.split(nnx.eval_shape(lambda: build(cfg, compute_dtype)))
    return graphdef, params, jax.eval_shape(tx.init, params)


def restore_params(run_dir, step: int | None = None, log=None):
    """(config, graphdef, params, step, compute dtype) of a run's checkpoint `step`, or of its newest intact
    one (each unreadable newer one skipped with one line through `log`): the one way to restore a run."""
    from frontier_jax import checkpoint, optim

    cfg, dtypes = read_run_config(run_dir)
    graphdef, aparams, aopt = abstract_state(cfg, dtypes.compute, optim.build_optimizer(cfg.optim, dtypes.muon_ns))
    state, meta = checkpoint.restore(Path(run_dir), {"params": aparams, "opt_state": aopt}, step=step,
                                     expect_model_hash=model_hash(cfg), log=log)
    return cfg, graphdef, state["params"], int(meta["step"]) if step is None else step, dtypes.compute


def export_run(run_dir, out) -> dict:
    cfg, _, params, step, dtype = restore_params(Path(run_dir))
    sd = params_to_state_dict(params)
    save_npz(out, sd, {"model": to_dict(cfg)["model"], "step": step, "source_run": str(run_dir),
                       "compute_dtype": str(dtype)})
    return {"keys": len(sd), "params": int(sum(v.size for v in sd.values())), "step": step, "out": str(out)}


def import_run(npz, cfg: Config, out_dir) -> dict:
    """A new run directory holding the npz's parameters (fresh optimizer state) as checkpoint 0."""
    import jax

    from frontier_jax import checkpoint, optim, parallel

    out_dir = Path(out_dir)
    if (out_dir / rundir.CONFIG).exists() or rundir.holds_run(out_dir):
        raise DataError(f"{out_dir}: already holds a run; choose a new --out")
    dtypes = resolve_dtypes(cfg, jax.default_backend())
    tx = optim.build_optimizer(cfg.optim, dtypes.muon_ns)
    _, aparams, _ = abstract_state(cfg, dtypes.compute, tx)
    sd, meta = load_npz(npz, expect=expected_shapes(aparams))  # keys and shapes from the headers, then arrays
    params = state_dict_to_params(sd, aparams, source=str(npz))  # checked before anything is written
    rundir.prepare_run_dir(out_dir, resume=False)
    rundir.write_json(out_dir / rundir.CONFIG, to_dict(cfg))
    rundir.write_json(out_dir / rundir.ENV, {**parallel.environment(), "compute_dtype": dtypes.compute,
                                             "muon_ns_dtype": dtypes.muon_ns, "imported_from": str(npz),
                                             "imported_meta": meta})
    ckpt_meta = {"step": 0, "train_seconds": 0.0, "tokens": 0, "data": {"shard": 0, "offset": 0, "position_tokens": 0},
                 "model_hash": model_hash(cfg), "model": to_dict(cfg)["model"], "reason": f"imported {npz}"}
    checkpoint.save(out_dir, 0, {"params": params, "opt_state": tx.init(params)}, ckpt_meta)
    return {"keys": len(sd), "out": str(out_dir), "step": 0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m frontier_jax.interop", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    what = "a run's latest checkpoint -> npz in PyTorch state_dict layout"
    ex = sub.add_parser("export", help=what, description=f"Write {what}.")
    ex.add_argument("--run", required=True, help="the run directory whose latest intact checkpoint is exported")
    ex.add_argument("--out", required=True, help="the .npz file to write (PyTorch state_dict names and layout)")
    what = "npz in PyTorch state_dict layout -> a new run directory"
    im = sub.add_parser("import", help=what, description=f"Read {what} (checkpoint step 0, fresh optimizer "
                                                          "state), which train --resume continues.")
    im.add_argument("--npz", required=True, help="the .npz to read (state_dict names; e.g. from "
                                                  "baseline_torch or interop export)")
    im.add_argument("--config", required=True, help="a configs/*.py file describing the model")
    im.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config value of the model, e.g. model.num_layers=4 (repeatable)")
    im.add_argument("--out", required=True, help="the run directory to create (it must not exist)")
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
