"""The contest rule profiles: every rule with its limit, its source (where it is stated, and the words) and how
the submission check verifies it. Nothing here imports JAX; docs/rules.md shows the profiles side by side
(`python -m frontier_jax.submission rules` prints that table).

Two profiles (`frontier_jax.config.RULE_PROFILES`, a run's `rules.profile`):

- `trainium-frontier`: the AWS Trainium Frontier contest as its entrants describe it, and nothing more. Its
  own rule text is not public here; the sources are entrants' accounts as the project's issue "Contest rules
  as code" collected them. A limit no entrant states is a rule with `known=False` (reported "not
  checkable", never guessed).
- `parameter-golf`: openai/parameter-golf, from its README and its records' READMEs (the four evaluation
  conditions of its issue #1017 are quoted there) and its `train_gpt.py` (how code bytes are counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier_jax.config import RULE_PROFILES, ConfigError

# where eval-time state comes from (the eval_data rule): the artifact, tables built from the training shards,
# state built from the validation tokens already scored (test-time training), or from the whole val split
ARTIFACT, TRAIN_SHARDS, SCORED_VAL, VAL_SPLIT = "the artifact", "train shards", "scored val prefix", "val split"
EVAL_SOURCES = (ARTIFACT, TRAIN_SHARDS, SCORED_VAL, VAL_SPLIT)

# verdicts of the submission check, one per rule
PASS, FAIL, NOT_CHECKABLE, NOT_APPLICABLE = "pass", "fail", "not checkable", "not applicable"
VERDICTS = (PASS, FAIL, NOT_CHECKABLE, NOT_APPLICABLE)

PG_REPO = "https://github.com/openai/parameter-golf/blob/main/"
ENTRANTS = "entrants' accounts of the AWS Trainium Frontier contest (issue \"Contest rules as code\")"


@dataclass(frozen=True)
class Verdict:
    """One line of the submission check: a rule, its verdict (one of VERDICTS) and the evidence."""

    rule: str
    verdict: str
    evidence: str


@dataclass(frozen=True)
class Source:
    where: str  # a URL or a repository path
    quote: str  # the words that state the rule there


@dataclass(frozen=True)
class Hardware:
    """The hardware a profile's time limits are stated on; `peak_flops` (dense BF16 matmul, all chips) is what
    a run's times are scaled by when it ran elsewhere (an estimate: compute-bound steps at equal MFU)."""

    name: str
    device_kind: str  # JAX's device_kind of one device
    devices: int  # JAX devices (a trn1 chip is 2 NeuronCore-v2 devices)
    peak_flops: float
    source: Source


@dataclass(frozen=True)
class Rule:
    id: str  # the check that verifies it (frontier_jax.contest.check.CHECKS)
    title: str
    statement: str  # the rule in one sentence
    sources: tuple[Source, ...]
    limit: float | None = None  # bytes or seconds, where the rule has a number
    known: bool = True  # False: no source states it (the check reports the evidence, "not checkable")
    # eval_data: the data eval-time state may come from (EVAL_SOURCES), and the ones no source rules on
    allows: tuple[str, ...] = ()
    unstated: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    hardware: Hardware
    rules: tuple[Rule, ...]

    def rule(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


# ----------------------------------------------------------------------------- hardware

TRN1_CHIP = Hardware(
    "one trn1 chip (Trainium, 2 NeuronCore-v2)", "NC_v2", 2, 190e12,
    Source("aws-neuron-sdk about-neuron/arch/neuron-hardware/trainium.rst",
           "Two NeuronCore-v2 delivering 380 INT8 TOPS, 190 FP16/BF16/cFP8/TF32 TFLOPS, and 47.5 FP32 TFLOP."))
H100_SXM_X8 = Hardware(
    "8x H100 SXM", "NVIDIA H100 80GB HBM3", 8, 8 * 1979e12 / 2,
    Source("https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM datasheet)",
           "BFLOAT16 Tensor Core 1,979 teraFLOPS* ... *With sparsity (dense: half of it, 989.5 TFLOPS)"))

# ----------------------------------------------------------------------------- trainium-frontier

_T_CONTEST = Source(ENTRANTS, "one Trainium chip, 30 minutes of training, score = bits per byte on held-out web "
                              "text (a public shard, and a private leaderboard shard)")
_T_REVIEWER = Source(ENTRANTS, "submissions go through an automated reviewer that checks the code against the rules")
_T_ENV = Source(ENTRANTS, "over 26 versions its file had grown from 5 to 50 environment-variable reads, so the "
                          "scored model's architecture could change without the code changing")
_T_BRANCH = Source(ENTRANTS, "it kept a branch that scaled the logits only at eval time")
_T_ACCEPTED = Source(ENTRANTS, "Its final system, a 14-layer network with an n-gram mix whose tables are built from "
                               "the training shards in a background thread while the network trains, was accepted.")
_T_SIZE = Source(ENTRANTS, "the Trainium contest scored a 14-layer model (about 24 MB after int8+zlib) with n-gram "
                           "tables built from training data (~252 MB in memory)")

TRAINIUM_FRONTIER = Profile(
    name="trainium-frontier",
    summary="AWS Trainium Frontier: one trn1 chip, 30 minutes of training, bpb on held-out web text; what its "
            "entrants state and nothing more",
    hardware=TRN1_CHIP,
    rules=(
        Rule("size", "artifact + code size", "No size cap is stated; an accepted entry's model was about 24 MB "
             "after int8+zlib (reported against no cap).", (_T_SIZE,), known=False),
        Rule("train_time", "training time", "Training runs at most 30 minutes on one trn1 chip.", (_T_CONTEST,),
             limit=1800.0),
        Rule("eval_time", "evaluation time", "No evaluation time limit is stated (reported against no limit).",
             (_T_CONTEST,), known=False),
        Rule("no_env", "no environment variables", "The code that builds and scores the model reads no "
             "environment variable (the automated reviewer rejected a submission whose architecture environment "
             "variables could change).", (_T_REVIEWER, _T_ENV)),
        Rule("one_forward", "one forward", "Training and evaluation share one forward: no eval-only branch (the "
             "reviewer rejected one that scaled the logits only at eval time).", (_T_REVIEWER, _T_BRANCH)),
        Rule("eval_data", "eval-time state", "Eval-time state (n-gram tables) may be built from the training shards, "
             "as the accepted entry's were; from validation tokens: not stated.", (_T_ACCEPTED, _T_SIZE),
             allows=(ARTIFACT, TRAIN_SHARDS), unstated=(SCORED_VAL,)),
        Rule("ttt_order", "test-time training", "No rule on test-time training is stated (a TTT log is reported, "
             "not judged).", (_T_CONTEST,), known=False),
    ),
)

# ----------------------------------------------------------------------------- parameter-golf

_README = PG_REPO + "README.md"
_P_SIZE = Source(_README, "The submission artifact is computed as code bytes plus compressed model bytes. All counted "
                          "code should live in the `train_gpt.py` script. The cap is decimal 16MB, i.e. 16,000,000 "
                          "total bytes, not 16 MiB / 16,777,216 bytes.")
_P_CODE = Source(PG_REPO + "train_gpt.py", 'code = Path(__file__).read_text(encoding="utf-8") ... '
                                           'code_bytes = len(code.encode("utf-8"))')
_P_TRAIN, _P_EVAL, _P_EVAL_DATA, _P_NO_DATASET, _P_VAL, _P_TTT = (Source(_README, q) for q in (
    "Final leaderboard submissions must run in under 10 minutes on 8xH100s (specifically the SXM variant)",
    "We won't accept submissions that take more than 10 minutes on 8xH100 to evaluate (Note: This limit is in "
    "addition to the 10 minutes of training time allowed!)",
    "you aren't allowed to access any training data during evaluation, unless you pay for those bits in the <16MB "
    "limit.",
    "No external downloads, training dataset access, or network calls are allowed during evaluation.",
    "You CANNOT access validation data during training",
    "you are only allowed to test-time train on validation set tokens _you've already evaluated your model on_, "
    "since those tokens have already been graded!",
))
_RECORD_0422 = PG_REPO + "records/track_10min_16mb/2026-04-22_SP8192_CaseOps_GatedAttn_QuantGate_Loop45_PhasedTTT_MLPClip12/README.md"
_P_C1 = Source(_RECORD_0422, "Issue #1017 Condition 1 (causal dependence) ... no position-t prediction is ever "
                             "conditioned on y_t or on positions > t.")
_P_C2 = Source(_RECORD_0422, "Issue #1017 Condition 2 (full normalized distribution) ... CE over the full 8192-token "
                             "softmax at each position")
_P_C3 = Source(_RECORD_0422, "Issue #1017 Condition 3 (score-before-update)")
_P_C4 = Source(_RECORD_0422, "Issue #1017 Condition 4 (single left-to-right pass) ... eval is one left-to-right pass "
                             "with sliding stride 64; no rescore/selection.")
_P_GPTQ = Source(PG_REPO + "records/track_10min_16mb/2026-03-25_ValCalib_GPTQ_XSA_BigramHash3072/README.md",
                 "prior Full Hessian GPTQ implementations (PRs #535, #569, #593, #609) calibrated on training data, "
                 "ruled illegal after the 600s window.")
_P_GPTQ_OK = Source(PG_REPO + "records/track_10min_16mb/2026-04-04_SP4096_DepthRecurrence_ParallelResid_MuonEqR/README.md",
                    "GPTQ calibration uses training data within the training time budget")

PARAMETER_GOLF = Profile(
    name="parameter-golf",
    summary="openai/parameter-golf: 16,000,000 bytes of artifact plus code, 10 minutes of training and 10 of "
            "evaluation on 8xH100 SXM",
    hardware=H100_SXM_X8,
    rules=(
        Rule("size", "artifact + code size", "The compressed model plus the code (UTF-8 bytes) is at most "
             "16,000,000 bytes.", (_P_SIZE, _P_CODE), limit=16_000_000),
        Rule("train_time", "training time", "Training runs at most 10 minutes on 8xH100 SXM.", (_P_TRAIN,),
             limit=600.0),
        Rule("eval_time", "evaluation time", "Evaluation runs at most 10 minutes on 8xH100 SXM.", (_P_EVAL,),
             limit=600.0),
        Rule("eval_data", "no training data at evaluation", "Evaluation reads no training data beyond what the "
             "artifact holds (counted in the cap); test-time state may come only from validation tokens "
             "already scored.", (_P_EVAL_DATA, _P_NO_DATASET, _P_TTT), allows=(ARTIFACT, SCORED_VAL)),
        Rule("train_data_in_time", "training data inside the training time", "Every use of training data, GPTQ "
             "calibration included, happens inside the training time.", (_P_GPTQ, _P_GPTQ_OK)),
        Rule("val_not_in_training", "no validation data in training", "Training reads no validation data.",
             (_P_VAL,)),
        Rule("causal", "condition 1: causal", "The score of position t depends on tokens before it only.", (_P_C1,)),
        Rule("normalized", "condition 2: full normalized distribution", "Each position is scored with a "
             "probability distribution over the whole vocabulary that sums to one.", (_P_C2,)),
        Rule("ttt_order", "condition 3: score before update", "Test-time training trains only on tokens already "
             "scored: every chunk is scored before it is trained on, and no trained token is scored later.",
             (_P_C3, _P_TTT)),
        Rule("single_pass", "condition 4: one left-to-right pass", "Every validation token is scored once, in one "
             "left-to-right pass (no rescoring, no selection).", (_P_C4,)),
    ),
)

PROFILES = {p.name: p for p in (TRAINIUM_FRONTIER, PARAMETER_GOLF)}
assert tuple(PROFILES) == RULE_PROFILES, "frontier_jax.config.RULE_PROFILES names the profiles defined here"


class UnknownProfile(ConfigError):
    """A rules profile name that is not one of RULE_PROFILES."""


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise UnknownProfile(f"--rules {name}: unknown rules profile (one of {', '.join(PROFILES)})")
    return PROFILES[name]


def markdown_table() -> str:
    """The profiles side by side (docs/rules.md): one row per rule id, each cell the rule's statement."""
    names = list(PROFILES)
    ids = list(dict.fromkeys(r.id for p in PROFILES.values() for r in p.rules))
    lines = ["| rule | " + " | ".join(f"`{n}`" for n in names) + " |", "|---|" + "---|" * len(names)]
    lines.append("| hardware | " + " | ".join(PROFILES[n].hardware.name for n in names) + " |")
    for rid in ids:
        cells = []
        for n in names:
            r = PROFILES[n].rule(rid)
            cells.append("(not a rule of this profile)" if r is None else
                         (r.statement if r.known else f"unknown: {r.statement}"))
        lines.append(f"| `{rid}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_sources() -> str:
    """Every rule's sources, per profile (docs/rules.md): where it is stated and the words."""
    lines = []
    for prof in PROFILES.values():
        lines.append(f"`{prof.name}` ({prof.hardware.name}: {prof.hardware.source.where}, "
                     f"\"{prof.hardware.source.quote}\"):\n")
        for r in prof.rules:
            quotes = "; ".join(f"{s.where}: \"{s.quote}\"" for s in r.sources)
            lines.append(f"- `{r.id}` ({r.title}{'' if r.known else ', unknown'}): {quotes}")
        lines.append("")
    return "\n".join(lines).rstrip()
