"""AWS's own NKI kernels, unchanged, under the NumPy emulator: one line per kernel, match / wrong / refused.

    python -m bench.aws_kernels PATH_TO_CHECKOUT [PATH_TO_CHECKOUT ...] [--target trn1]

A checkout is a local copy of aws-neuron/nki-library (recognised by `src/nkilib_src/nkilib`) or
aws-neuron/nki-samples (`src/nki_samples`), fetched by the user. Every file of the checkout's kernel tree
that defines an `@nki.jit` kernel is loaded through the emulator's loader (`emulator.load_kernel_file`: the
AST pass, then the file run against the emulated nki). A kernel with a case in `bench.aws_cases` (inputs from
its repository's own test, a NumPy port of its repository's reference, the test's tolerance) runs and is
compared per output with the repository's comparator (`close`):

    match    every output within the test's tolerance
    wrong    an output outside it (the largest error printed)
    refused  the emulator stops it: a rule of the table (id and source), an unemulated feature, a Python
             error; or, for a file without a case, the documented feature it needs that is out of scope
    scope    the file loads (AST pass and module body pass); it needs a documented feature outside the
             emulator's targets (aws_cases.OUT_OF_SCOPE: which, and why)
    loads    the file loads but no case runs it

Not a test (AWS's code is not in the repository); `tests/test_bench_aws_kernels.py` runs the script on a
kernel of our own laid out like a checkout.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import numpy as np

from bench import aws_cases
from kernels_nki import emulator

# nki-library: its core kernels (the library's supported API; experimental/ is outside it)
LAYOUTS = {"nki-library": os.path.join("src", "nkilib_src", "nkilib"),
           "nki-samples": os.path.join("src", "nki_samples")}
SCAN = {"nki-library": "core"}


def repository(checkout: str) -> tuple[str, str]:
    """(repository name, kernel tree) of a checkout."""
    for repo, tree in LAYOUTS.items():
        if os.path.isdir(os.path.join(checkout, tree)):
            return repo, os.path.join(checkout, tree)
    raise SystemExit(f"{checkout}: not an nki-library or nki-samples checkout (no {' or '.join(LAYOUTS.values())})")


def kernel_files(tree: str) -> list[str]:
    """Files under `tree` defining an @nki.jit kernel (not the repositories' torch references or tests)."""
    out = []
    for dirpath, _, files in os.walk(tree):
        for f in sorted(files):
            if not f.endswith(".py") or f.endswith("_torch.py") or f.startswith("test_"):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                if "@nki.jit" in fh.read():
                    out.append(path)
    return sorted(out)


def _reason(exc: BaseException) -> str:
    """One line: the rule / error and the innermost checkout or kernel frame."""
    text = " ".join(str(exc).split())
    if isinstance(exc, SyntaxError):
        return f"the file does not parse: {exc.msg} at line {exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "kernels_nki/emulator" not in f.filename]
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    kind = "" if isinstance(exc, emulator.NkiRuleError) else f"{type(exc).__name__}: "
    return f"{kind}{text[:400]}{where if not isinstance(exc, emulator.NkiRuleError) else ''}"


def close(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float, mode: str) -> bool:
    """`mode="max"`: nki-library's comparator (test/integration/nkilib/utils/comparators.py, maxAllClose, its
    default mode): |out - ref| <= atol + rtol * max|ref| everywhere; `"allclose"`: np.allclose (per element)."""
    if mode == "max":
        return bool(np.all(np.abs(out - ref) <= atol + rtol * np.nanmax(np.abs(ref))))
    return bool(np.allclose(out, ref, rtol=rtol, atol=atol))


def _compare(outs, refs, rtol, atol, mode: str) -> tuple[bool, str]:
    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = refs if isinstance(refs, tuple) else (refs,)
    if len(outs) != len(refs):
        return False, f"{len(outs)} outputs, reference has {len(refs)}"
    worst, ok = [], True
    rtols = rtol if isinstance(rtol, tuple) else (rtol,) * len(refs)
    atols = atol if isinstance(atol, tuple) else (atol,) * len(refs)
    for i, (o, r) in enumerate(zip(outs, refs)):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        if o.shape != r.shape:
            return False, f"output {i} shape {o.shape}, reference {r.shape}"
        ok &= close(o, r, rtols[i], atols[i], mode)
        worst.append(f"max |err| {np.abs(o - r).max():.3g}")
    return ok, "; ".join(worst) + f" ({mode}: rtol {'/'.join(f'{t:g}' for t in rtols)}, atol " \
        f"{'/'.join(f'{t:g}' for t in atols)})"


def run_case(case: aws_cases.Case, tree: str, target: str) -> tuple[str, str]:
    try:
        module = emulator.load_kernel_file(os.path.join(tree, case.path))
        args, kwargs = case.inputs(module)
        outs, _ = emulator.run(getattr(module, case.kernel), *args, target=case.target or target, **kwargs)
    except Exception as exc:  # every failure is reported, one line per kernel
        return "refused", _reason(exc)
    if case.outputs is not None:
        outs = tuple(outs[i] for i in case.outputs)
    if case.unpack is not None:
        outs = case.unpack(outs, args)
    ok, detail = _compare(outs, case.reference(args, kwargs), case.rtol, case.atol, case.compare)
    return ("match" if ok else "wrong"), detail


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkouts", nargs="+", help="local checkouts of aws-neuron/nki-library or nki-samples")
    p.add_argument("--target", choices=emulator.TARGETS, default="trn1")
    args = p.parse_args(argv)
    counts: dict[str, int] = {}
    for checkout in args.checkouts:
        repo, tree = repository(checkout)
        cases = [c for c in aws_cases.CASES if c.repo == repo]
        covered = {c.path for c in cases}
        for case in cases:
            status, detail = run_case(case, tree, args.target)
            counts[status] = counts.get(status, 0) + 1
            on = f" [{case.target}]" if case.target else ""
            print(f"{repo}:{case.path}:{case.name}{on}  {status:8s} {detail}", flush=True)
        for path in kernel_files(os.path.join(tree, SCAN.get(repo, ""))):
            rel = os.path.relpath(path, tree)
            if rel in covered:
                continue
            try:
                emulator.load_kernel_file(path)
                status, detail = "loads", "no case"
                if (repo, rel) in aws_cases.OUT_OF_SCOPE:
                    status, detail = "scope", "out of scope: " + aws_cases.OUT_OF_SCOPE[(repo, rel)]
            except Exception as exc:
                status, detail = "refused", _reason(exc)
            counts[status] = counts.get(status, 0) + 1
            print(f"{repo}:{rel:48s} {status:8s} {detail}", flush=True)
    print("total: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
