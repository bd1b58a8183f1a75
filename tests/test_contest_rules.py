"""The rule profiles: the two contests' rules with their limits and sources, the config field that names a
profile, and docs/rules.md's side-by-side table generated from them."""

import json
from pathlib import Path

import pytest

from frontier_jax.config import RULE_PROFILES, Config, ConfigError, RulesConfig, apply_overrides, from_dict, to_dict
from frontier_jax.contest import rules

REPO = Path(__file__).resolve().parents[1]


def test_the_profiles_are_the_config_choices_and_every_rule_has_a_quoted_source():
    assert tuple(rules.PROFILES) == RULE_PROFILES == ("trainium-frontier", "parameter-golf")
    for prof in rules.PROFILES.values():
        ids = [r.id for r in prof.rules]
        assert len(ids) == len(set(ids)), prof.name
        for r in prof.rules:
            assert r.sources and all(s.where and len(s.quote) > 20 for s in r.sources), (prof.name, r.id)
            assert r.known or r.limit is None, f"{prof.name}.{r.id}: an unknown rule states no number"
        assert prof.hardware.peak_flops > 0 and prof.hardware.source.quote


def test_parameter_golf_numbers_are_its_readme_s():
    pg = rules.PARAMETER_GOLF
    assert pg.rule("size").limit == 16_000_000  # decimal, not 16 MiB
    assert pg.rule("train_time").limit == pg.rule("eval_time").limit == 600
    assert (pg.hardware.devices, pg.hardware.peak_flops) == (8, 8 * 989.5e12)
    assert {"causal", "normalized", "ttt_order", "single_pass", "eval_data", "train_data_in_time"} <= {
        r.id for r in pg.rules}
    assert rules.SCORED_VAL in pg.rule("eval_data").allows and rules.TRAIN_SHARDS not in pg.rule("eval_data").allows
    assert all(s.where.startswith(rules.PG_REPO) for r in pg.rules for s in r.sources)


def test_trainium_frontier_states_only_what_entrants_state():
    tf = rules.TRAINIUM_FRONTIER
    assert tf.rule("train_time").limit == 1800 and (tf.hardware.device_kind, tf.hardware.devices) == ("NC_v2", 2)
    unknown = {r.id for r in tf.rules if not r.known}
    assert unknown == {"size", "eval_time", "ttt_order"}
    assert rules.TRAIN_SHARDS in tf.rule("eval_data").allows and rules.SCORED_VAL in tf.rule("eval_data").unstated
    assert {"no_env", "one_forward"} <= {r.id for r in tf.rules}
    assert all(s.where == rules.ENTRANTS for r in tf.rules for s in r.sources)


def test_rules_profile_is_a_config_field():
    assert Config().rules.profile == "trainium-frontier"
    cfg = apply_overrides(Config(), ["rules.profile=parameter-golf"])
    assert cfg.rules.profile == "parameter-golf"
    assert from_dict(json.loads(json.dumps(to_dict(cfg)))) == cfg
    old = to_dict(Config())
    del old["rules"]  # a run directory written before the field: the default
    assert from_dict(old).rules == RulesConfig()
    with pytest.raises(ConfigError) as e:
        apply_overrides(Config(), ["rules.profile=golf"])
    assert "rules.profile" in str(e.value) and "trainium-frontier|parameter-golf" in str(e.value)
    with pytest.raises(rules.UnknownProfile, match="--rules golf: unknown rules profile"):
        rules.profile("golf")


def test_docs_rules_md_has_the_generated_table_and_sources():
    """docs/rules.md's side-by-side table and sources are `python -m frontier_jax.submission rules --markdown`."""
    from frontier_jax.submission.__main__ import main

    doc = (REPO / "docs" / "rules.md").read_text()
    assert rules.markdown_table() in doc and rules.markdown_sources() in doc
    assert all(f"`{rid}`" in doc.split("## How each rule is checked")[1] for rid in {
        r.id for p in rules.PROFILES.values() for r in p.rules}), "every rule's check is described"
