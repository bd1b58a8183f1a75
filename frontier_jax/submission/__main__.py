"""python -m frontier_jax.submission: check a run against a contest rules profile, or print the profiles.

    python -m frontier_jax.submission check RUN [--rules NAME]
    python -m frontier_jax.submission rules [--markdown]

`check` prints one line per rule of the profile (default: the run's own `rules.profile`) with its verdict
and evidence, then a summary line. Exit status: 0 when every checkable rule passes, 1 when a rule fails,
2 for bad input (one line naming the file or the problem: no run directory, an unreadable record, an
unknown profile, a ttt.jsonl that breaks its contract).
"""

from __future__ import annotations

import argparse
import sys

from frontier_jax.config import RULE_PROFILES
from frontier_jax.errors import ArgumentParser, exit_on_error


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m frontier_jax.submission", description=__doc__.splitlines()[0],
                                epilog="exit codes: 0 every checkable rule passes, 1 a rule fails, 2 bad input; "
                                       "the rules and how each is checked: docs/rules.md")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check a run directory against a rules profile",
                       description="Check a run directory against a rules profile: one line per rule, then a summary.")
    c.add_argument("run", metavar="RUN", help="the run directory")
    c.add_argument("--rules", metavar="NAME", help=f"the profile ({' | '.join(RULE_PROFILES)}; default: the "
                                                   "run's rules.profile)")
    r = sub.add_parser("rules", help="print the profiles: every rule with its source",
                       description="Print the rules profiles: every rule with its source.")
    r.add_argument("--markdown", action="store_true", help="docs/rules.md's side-by-side table and sources")
    return p


def _print_rules(markdown: bool) -> None:
    from frontier_jax.contest import rules

    if markdown:
        print(rules.markdown_table() + "\n\n" + rules.markdown_sources())
        return
    for prof in rules.PROFILES.values():
        print(f"{prof.name}: {prof.summary}\n  hardware: {prof.hardware.name} ({prof.hardware.source.where})")
        for r in prof.rules:
            print(f"  {r.id}: {'' if r.known else 'unknown: '}{r.statement}")
            for s in r.sources:
                print(f"      {s.where}: \"{s.quote}\"")


def main(argv=None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "rules":
        _print_rules(args.markdown)
        return 0
    from frontier_jax.submission import check

    with exit_on_error():
        prof, run, verdicts = check.check_run(args.run, args.rules)
    print(check.report(prof, run, verdicts), flush=True)
    return check.exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())
