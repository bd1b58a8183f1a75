"""Weights in the PyTorch baseline's `state_dict` layout, as a plain `.npz` (no torch needed), or in the
parameter-golf record's (`--format pg-record`: its `final_model.pt` and its script's `record.env`).

    python -m frontier_jax.interop export --run DIR --out FILE.npz
    python -m frontier_jax.interop import --npz FILE.npz --config PATH [--set k=v]... --out DIR
    python -m frontier_jax.interop export --run DIR --format pg-record --out OUTDIR
    python -m frontier_jax.interop import --format pg-record SRCDIR [--set k=v]... --out DIR

Keys are exactly the baseline's parameter names (`tok_emb.weight` [V, D], `skip_weights` [S, D],
`blocks.{i}.attn.c_q.weight` [out, in], `blocks.{i}.attn.q_gain`, `blocks.{i}.resid_mix`, ...), and for the
recipe's parameters the record's (`bigram.embed.weight`, `bigram.proj.weight` [out, in], `bigram.scale`,
`smear.gate`, `ve_shared.{embed,proj}.weight`, `ve_shared.scale`, `ve_layer_scales.{k}`): the record's
unbanked names (frontier_jax.interop.pg_record). Linear weights are stored [in, out] in this package and
[out, in] in PyTorch, so they are transposed on the way out and back. In the npz every array is saved as
float32 (exact for bf16 values); the original dtype of each key is recorded in the JSON string entry
`__dtypes__`, and `__meta__` holds the model config. Entries whose names start with `__` are metadata, never
parameters. JAX is imported only by the functions that need it, so `--help` answers at once.

pg-record: `final_model.pt` is exactly the record's `GPT.state_dict()` for the run's model (the per-layer
matrices banked, its key order, shapes and dtypes; torch.save's format, written without torch) and
`record.env` the record script's environment that builds the same model and evaluation; a config the script
cannot express is refused in one line naming the setting. Its import builds the config from `record.env` (the
script's defaults for what it does not set, `--set` after) and the weights from `final_model.pt`.

`import` builds a run directory (config.json + checkpoint at step 0) whose parameters are the file's
and whose optimizer state is freshly initialised: `python -m frontier_jax.evaluate --run DIR` scores
it; `python -m frontier_jax.train --resume DIR` would start training from these weights with a new
optimizer state and the data stream at its beginning.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

from frontier_jax.config import Config, apply_overrides, host_memory_bytes, load_config, model_hash, to_dict
from frontier_jax.data.shards import DataError
from frontier_jax.data.files import atomic_write, read_regular
from frontier_jax.errors import ArgumentParser, exit_on_error
from frontier_jax.interop import pg_record, torch_format
from frontier_jax.interop.npz import WeightsError, check_weights, load_npz, save_npz
from frontier_jax.policies.dtypes import Dtypes
from frontier_jax.policies.dtypes import resolve as resolve_dtypes
from frontier_jax.run import rundir

LINEAR_NAMES = ("c_q", "c_k", "c_v", "proj", "fc")  # stored [in, out] here, [out, in] in PyTorch
SIDE_MODULES = ("bigram", "ve_shared")  # the recipe's tables: `embed` and `proj` are PyTorch modules' weights
META_PREFIX = "__"
FORMATS = ("npz", "pg-record")
PG_RECORD_STATE, PG_RECORD_ENV = "final_model.pt", "record.env"  # pg-record's files


InteropError = WeightsError  # an npz that does not fit the model or cannot be read


def torch_name(names: list[str]) -> tuple[str, bool]:
    """(state_dict key, transposed?) of one parameter path of ours."""
    if names == ["tok_emb"]:
        return "tok_emb.weight", False
    if names[-1] in LINEAR_NAMES and names[0] == "blocks":
        return ".".join(names) + ".weight", True
    if names[0] in SIDE_MODULES and names[-1] in ("embed", "proj"):
        return ".".join(names) + ".weight", names[-1] == "proj"
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
    check_weights(sd, expected_shapes(abstract_params), source)  # the validator both trainers share
    leaves = []
    for path, leaf in flat:
        key, transposed = torch_name(path_names(path))
        arr = np.asarray(sd[key])
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
    one (each unreadable newer one skipped with one line through `log`): the one way to restore a run. The
    params are the weights the run scores (`optim.final_params`: its EMA where it keeps one, optim.ema_decay), so
    that `evaluate`, `export` and `export --format pg-record` see what the run's final evaluation and artifact do."""
    from frontier_jax import checkpoint, optim

    cfg, dtypes = read_run_config(run_dir)
    graphdef, aparams, aopt = abstract_state(cfg, dtypes.compute, optim.build_optimizer(cfg.optim, dtypes.muon_ns))
    state, meta = checkpoint.restore(Path(run_dir), {"params": aparams, "opt_state": aopt}, step=step,
                                     expect_model_hash=model_hash(cfg), log=log)
    params = optim.final_params(state["params"], state["opt_state"])
    return cfg, graphdef, params, int(meta["step"]) if step is None else step, dtypes.compute


def export_run(run_dir, out) -> dict:
    cfg, _, params, step, dtype = restore_params(Path(run_dir))
    sd = params_to_state_dict(params)
    save_npz(out, sd, {"model": to_dict(cfg)["model"], "step": step, "source_run": str(run_dir),
                       "compute_dtype": str(dtype)})
    return {"keys": len(sd), "params": int(sum(v.size for v in sd.values())), "step": step, "out": str(out)}


def _import_target(cfg: Config, out_dir: Path):
    """(dtypes, optimizer, abstract params) of a run to import into `out_dir`, which must not hold a run yet."""
    import jax

    from frontier_jax import optim

    if (out_dir / rundir.CONFIG).exists() or rundir.holds_run(out_dir):
        raise DataError(f"{out_dir}: already holds a run; choose a new --out")
    dtypes = resolve_dtypes(cfg, jax.default_backend())
    tx = optim.build_optimizer(cfg.optim, dtypes.muon_ns)
    return dtypes, tx, abstract_state(cfg, dtypes.compute, tx)[1]


def _write_imported_run(out_dir: Path, cfg: Config, dtypes, tx, params, source, meta) -> None:
    """The run directory of imported parameters: config.json, env.json and checkpoint 0 (fresh optimizer state).
    On any failure (e.g. a full disk) what it wrote is removed, so a retry with the same --out works."""
    from frontier_jax import checkpoint, parallel

    created = not out_dir.exists()
    rundir.prepare_run_dir(out_dir, resume=False)
    try:
        rundir.write_json(out_dir / rundir.CONFIG, to_dict(cfg))
        rundir.write_json(out_dir / rundir.ENV, {**parallel.environment(), "compute_dtype": dtypes.compute,
                                                 "muon_ns_dtype": dtypes.muon_ns, "imported_from": str(source),
                                                 "imported_meta": meta})
        ckpt_meta = {"step": 0, "train_seconds": 0.0, "tokens": 0,
                     "data": {"shard": 0, "offset": 0, "position_tokens": 0},
                     "model_hash": model_hash(cfg), "model": to_dict(cfg)["model"], "reason": f"imported {source}"}
        checkpoint.save(out_dir, 0, {"params": params, "opt_state": tx.init(params)}, ckpt_meta)
    except BaseException:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:
            for name in (rundir.CONFIG, rundir.ENV):
                (out_dir / name).unlink(missing_ok=True)
        raise


def import_run(npz, cfg: Config, out_dir) -> dict:
    """A new run directory holding the npz's parameters (fresh optimizer state) as checkpoint 0."""
    out_dir = Path(out_dir)
    dtypes, tx, aparams = _import_target(cfg, out_dir)
    sd, meta = load_npz(npz, expect=expected_shapes(aparams))  # keys and shapes from the headers, then arrays
    params = state_dict_to_params(sd, aparams, source=str(npz))  # checked before anything is written
    _write_imported_run(out_dir, cfg, dtypes, tx, params, npz, meta)
    return {"keys": len(sd), "out": str(out_dir), "step": 0}


# ----------------------------------------------------------------------------- the record's format (pg-record)


def record_state_dict(params, cfg: Config, source: str = "<params>") -> dict[str, np.ndarray]:
    """The record's `GPT.state_dict()` of our parameters: banked, its key order, shapes and dtypes (pg_record)."""
    pg_record.expressible(cfg)
    unbanked = pg_record.unbanked_state_dict(params_to_state_dict(params), cfg.model, source)
    return pg_record.bank(unbanked, cfg.model)


def export_pg_record(run_dir, out_dir) -> dict:
    """`out_dir/final_model.pt` (the record's state dict of the run's newest intact checkpoint) and
    `out_dir/record.env` (its script's environment for the run's model and evaluation)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    cfg, _, params, step, _ = restore_params(run_dir)
    env = pg_record.record_env(cfg)  # refused before any file is written when the script cannot express it
    sd = record_state_dict(params, cfg, source=f"{run_dir} checkpoint {step}")
    for name, data in ((PG_RECORD_STATE, torch_format.dumps(sd)), (PG_RECORD_ENV, pg_record.format_env(env).encode())):
        atomic_write(out_dir / name, [data])  # each whole under a temporary name, then renamed into place
    return {"keys": len(sd), "params": int(sum(v.size for v in sd.values())), "step": step, "out": str(out_dir)}


def read_record_state(path, m) -> dict[str, np.ndarray]:
    """A record `final_model.pt` (torch.save of its `GPT.state_dict()`, read without torch) checked against the
    record's keys, shapes and dtypes for model `m`; InteropError naming the file and the first mismatch."""
    path = Path(path)
    try:
        limit = host_memory_bytes()
        sd = torch_format.loads(read_regular(path, "the record's state dict", None if limit is None else limit // 2))
    except FileNotFoundError:
        raise InteropError(f"{path}: no such file") from None
    except (OSError, torch_format.TorchFormatError) as e:
        raise InteropError(f"{path}: {e}") from None
    if not isinstance(sd, dict):
        raise InteropError(f"{path}: holds a {type(sd).__name__}, not a state dict")
    want = pg_record.banked_shapes(m)
    missing, extra = [k for k in want if k not in sd], sorted(set(sd) - set(want))
    if missing or extra:
        what = f"missing key {missing[0]!r}" if missing else f"unexpected key {extra[0]!r}"
        raise InteropError(f"{path}: {what} ({len(missing)} missing, {len(extra)} not in the model of record.env)")
    for k, (shape, dtype) in want.items():
        a = sd[k]
        if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != dtype:
            got = f"{list(a.shape)} {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__
            raise InteropError(f"{path}: key {k!r} is {got}, the record's model holds {list(shape)} {dtype}")
    return sd


def import_pg_record(src_dir, out_dir, sets=()) -> dict:
    """A new run directory from a record's `final_model.pt` and `record.env` (module doc); the variables of
    record.env that the config does not apply are returned under "not_applied"."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    cfg, ignored = pg_record.config_from_env(pg_record.read_env(src_dir / PG_RECORD_ENV),
                                             str(src_dir / PG_RECORD_ENV))
    cfg = apply_overrides(cfg, list(sets))
    dtypes, tx, aparams = _import_target(cfg, out_dir)
    source = src_dir / PG_RECORD_STATE
    unbanked = pg_record.unbank(read_record_state(source, cfg.model), cfg.model)
    params = state_dict_to_params(unbanked, aparams, source=str(source))
    _write_imported_run(out_dir, cfg, dtypes, tx, params, source, {"format": "pg-record", "not_applied": ignored})
    return {"keys": len(unbanked), "out": str(out_dir), "step": 0, "not_applied": ignored}


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m frontier_jax.interop", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = ap.add_subparsers(dest="cmd", required=True)
    what = ("a run's latest checkpoint -> npz in PyTorch state_dict layout, or the record's final_model.pt + "
            "record.env (--format pg-record)")
    ex = sub.add_parser("export", help=what, description=f"Write {what}.")
    ex.add_argument("--run", required=True, help="the run directory whose latest intact checkpoint is exported")
    ex.add_argument("--format", choices=FORMATS, default="npz",
                    help="npz (default: PyTorch state_dict names and layout) or pg-record (the record's files)")
    ex.add_argument("--out", required=True, help="the .npz file (npz) or a directory (pg-record)")
    what = ("npz in PyTorch state_dict layout, or a directory with the record's final_model.pt + record.env "
            "(--format pg-record) -> a new run directory")
    im = sub.add_parser("import", help=what, description=f"Read {what} (checkpoint step 0, fresh optimizer "
                                                          "state), which train --resume continues.")
    im.add_argument("source", nargs="?", help="pg-record: the directory holding final_model.pt and record.env")
    im.add_argument("--format", choices=FORMATS, default="npz",
                    help="npz (default: a state_dict .npz) or pg-record (the record's final_model.pt + record.env)")
    im.add_argument("--npz", help="npz: the file to read (state_dict names; e.g. from baseline_torch or interop "
                                  "export)")
    im.add_argument("--config", help="npz: a configs/*.py file describing the model")
    im.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config value of the model, e.g. model.num_layers=4 (repeatable)")
    im.add_argument("--out", required=True, help="the run directory to create (it must not exist)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "import":
        need = ("source",) if args.format == "pg-record" else ("npz", "config")
        absent = [n for n in need if getattr(args, n) is None]
        wrong = [n for n in ("source", "npz", "config") if n not in need and getattr(args, n) is not None]
        if absent or wrong:
            ap.error(f"import --format {args.format}: " + (f"needs {' and '.join(absent)}" if absent
                                                           else f"takes no {wrong[0]}"))
    with exit_on_error():
        if args.cmd == "export" and args.format == "pg-record":
            r = export_pg_record(args.run, args.out)
            print(f"exported {r['keys']} tensors ({r['params']:,} parameters) from step {r['step']} -> "
                  f"{r['out']}/{PG_RECORD_STATE}, {r['out']}/{PG_RECORD_ENV}")
        elif args.cmd == "export":
            r = export_run(args.run, args.out)
            print(f"exported {r['keys']} arrays ({r['params']:,} parameters) from step {r['step']} -> {r['out']}")
        elif args.format == "pg-record":
            r = import_pg_record(args.source, args.out, args.set)
            print(f"imported {r['keys']} tensors -> {r['out']} (checkpoint step 0, fresh optimizer state)"
                  + (f"; record.env settings not applied: {', '.join(r['not_applied'])}" if r["not_applied"] else ""))
        else:
            cfg = apply_overrides(load_config(args.config), args.set)
            r = import_run(args.npz, cfg, args.out)
            print(f"imported {r['keys']} arrays -> {r['out']} (checkpoint step 0, fresh optimizer state)")
    return 0
