"""Counter assertions (bug record R19): the ``expect.counters`` schema, the ``counters`` check over the
metrics timeline (moved right / wrongly / absent / restarted) and the healthy-run rule
``nixl-failed-transfers`` through the verdict engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rig.config import ConfigError, CounterRule, ScenarioConfig
from rig.config.loading import load_config
from rig.judge.counter_rules import HEALTHY_NAME, counter_rules_check, movement, rule_state, split_series
from rig.judge.verdict import judge, required_checks
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation

EXPIRED = 'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="tiny"}'
FAILED = 'vllm:nixl_num_failed_transfers_total{engine="0",model_name="tiny"}'
R19 = [CounterRule(instance="prefill", metric=m.NIXL_EXPIRED, delta=1),
       CounterRule(instance="decode", metric=m.NIXL_FAILED_TRANSFERS, delta=0)]


def row(inst: str, counters: dict[str, float], life: float = 1.0) -> dict:
    return {"instance": inst, "t": 0.0, "scenario": "s", "counters": counters, "life": life}


def lease_rows(p_expired=(3.0, 4.0), d_failed=(0.0, 0.0)) -> list[dict]:
    """P and D sampled before the requests and once idle, as rig/run/runner.py does."""
    return [row("prefill", {EXPIRED: p_expired[0], FAILED: 0.0}), row("decode", {FAILED: d_failed[0]}),
            row("decode", {FAILED: d_failed[1]}), row("prefill", {EXPIRED: p_expired[1], FAILED: 0.0}),
            row("decode", {FAILED: d_failed[1]})]


# ------------------------------------------------------------------ schema


def test_rule_from_yaml_and_its_bounds_in_words():
    r = CounterRule.model_validate(yaml.safe_load(
        '{instance: prefill, metric: "vllm:nixl_num_kv_expired_reqs_total", delta: 1, why: one lease}'))
    assert (r.instance, r.delta, r.expected()) == ("prefill", 1, "+1")
    assert CounterRule(instance="decode", metric="vllm:x_total", min=1).expected() == ">= +1"
    assert CounterRule(instance="decode", metric="vllm:x_total", max=0).expected() == "<= +0"
    assert CounterRule(instance="decode", metric="vllm:x_total", min=1, max=3).expected() == "+1..+3"
    assert r.holds(1) and not r.holds(0) and not r.holds(2)


@pytest.mark.parametrize(("text", "says"), [
    ('{instance: decode, metric: "vllm:nixl_num_failed_transfers", delta: 0}',
     "vllm:nixl_num_failed_transfers_total"),  # the family name, not the sample name
    ('{instance: decode, metric: "vllm:x_total", delta: 0, max: 1}', "give delta, or min and/or max, not both"),
    ('{instance: decode, metric: "vllm:x_total"}', "give delta (exactly), or min and/or max"),
    ('{instance: decode, metric: "vllm:x_total", min: 3, max: 1}', "min 3 is above max 1"),
    ('{on: decode, metric: "vllm:x_total", delta: 0}', "YAML reads a bare `on:` key as true"),
    ('{instance: decode, metric: "vllm:x_total", delta: -1}', "greater than or equal to 0"),
])
def test_bad_rule_is_one_clear_error(text, says):
    with pytest.raises(ValueError, match=None) as e:
        CounterRule.model_validate(yaml.safe_load(text))
    assert says in str(e.value)


def test_rule_on_an_unknown_instance_names_the_choices(tmp_path):
    cfg = yaml.safe_load(Path("configs/cpu-regressions.yaml").read_text())
    cfg.pop("suite")
    cfg["scenarios"] = [{"name": "x", "decode": "decode-nospec", "prompt_tokens": 8, "max_tokens": 2,
                         "expect": {"counters": [{"instance": "decode-9", "metric": "vllm:x_total", "delta": 0}]}}]
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError,
                       match=r"expect.counters instance 'decode-9': give prefill, decode or this scenario's pair"):
        load_config(p)


def test_regression_suite_r07_and_r19_carry_the_r19_rules():
    cfg = load_config("configs/cpu-regressions.yaml")
    by = {s.name: s for s in cfg.scenarios}
    for name in ("r07-lease-expired-read", "r19-expiry-not-transfer-failure"):
        rules = {(r.instance, r.metric): r.delta for r in by[name].expect.counters}
        assert rules[("prefill", m.NIXL_EXPIRED)] == 1 and rules[("decode", m.NIXL_FAILED_TRANSFERS)] == 0
        assert "counters" in required_checks(by[name])


# ------------------------------------------------------------------ the check


def test_split_series_reads_timeline_keys():
    assert split_series(EXPIRED) == (m.NIXL_EXPIRED, {"engine": "0", "model_name": "tiny"})
    assert split_series("vllm:x_total") == ("vllm:x_total", {})


def test_counter_split_holds():
    c = counter_rules_check(lease_rows(), R19, "prefill", "decode")
    assert c.ok is True and c.requests == ()
    assert f"prefill {m.NIXL_EXPIRED} +1 (expected +1)" in c.detail
    assert f"decode {m.NIXL_FAILED_TRANSFERS} +0 (expected +0)" in c.detail


def test_expiry_counted_as_failure_fails_naming_both():
    """The pre-#55854 accounting: the expired lease shows up as D's failed transfer."""
    c = counter_rules_check(lease_rows(p_expired=(3.0, 3.0), d_failed=(0.0, 1.0)), R19, "prefill", "decode")
    assert c.ok is False
    assert f"prefill {m.NIXL_EXPIRED} +0 (expected +1)" in c.detail
    assert f"decode {m.NIXL_FAILED_TRANSFERS} +1 (expected +0)" in c.detail


def test_absent_metric_is_not_checked_naming_it_never_ok():
    rows = [r for r in lease_rows()]
    for r in rows:
        if r["instance"] == "prefill":
            r["counters"] = {FAILED: 0.0}
    c = counter_rules_check(rows, R19, "prefill", "decode")
    assert c.ok is None and f"prefill lacks {m.NIXL_EXPIRED}" in c.detail


def test_a_failure_wins_over_a_gap():
    rows = [row("decode", {FAILED: 0.0}), row("decode", {FAILED: 2.0})]
    c = counter_rules_check(rows, R19, "prefill", "decode")
    assert c.ok is False and "prefill sampled 0 time(s)" in c.detail


def test_labels_select_series():
    a = 'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"}'
    b = 'vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"}'
    rows = [row("decode", {a: 0.0, b: 0.0}), row("decode", {a: 64.0, b: 5.0})]
    r = CounterRule(instance="decode", metric=m.PROMPT_TOKENS_BY_SOURCE, labels={"source": "external_kv_transfer"},
                    min=64)
    assert movement(rows, "decode", r)[0] == 64.0
    assert rule_state(rows, r, "p", "decode")[0] is True
    other = r.model_copy(update={"labels": {"source": "nope"}})
    assert rule_state(rows, other, "p", "decode") == (
        None, "decode " + m.PROMPT_TOKENS_BY_SOURCE + "{'source': 'nope'} not checked: decode lacks "
        + m.PROMPT_TOKENS_BY_SOURCE + " with labels {'source': 'nope'}")


def test_restart_sums_lives_min_holds_delta_not_checked():
    rows = [row("prefill", {EXPIRED: 5.0}, life=1.0), row("prefill", {EXPIRED: 6.0}, life=1.0),
            row("prefill", {EXPIRED: 0.0}, life=2.0), row("prefill", {EXPIRED: 1.0}, life=2.0)]
    assert movement(rows, "prefill", R19[0])[:2] == (2.0, 2)
    ok, detail = rule_state(rows, CounterRule(instance="prefill", metric=m.NIXL_EXPIRED, min=1), "prefill", "d")
    assert ok is True and "lower bound" in detail
    ok, detail = rule_state(rows, R19[0], "prefill", "d")
    assert ok is None and "restarted (2 process lives)" in detail


def test_an_instance_outside_the_scenario_is_not_checked():
    ok, detail = rule_state(lease_rows(), CounterRule(instance="decode-6blk", metric=m.NIXL_EXPIRED, delta=0),
                            "prefill", "decode")
    assert ok is None and "not this scenario's prefill" in detail


# ------------------------------------------------------------------ through the verdict engine


def _sc(**extra) -> ScenarioConfig:
    return ScenarioConfig.model_validate({"name": "s", "decode": "decode", "prompt_tokens": 8, "max_tokens": 2,
                                          "expect": {"completion_tokens": 2, "total_tokens": 10, **extra}})


def _obs(rows) -> ScenarioObservation:
    return ScenarioObservation(scenario="s", decode="decode", prefill="prefill", timeline=rows,
                               vllm_version="0.32.0", versions={"prefill": "0.32.0", "decode": "0.32.0"})


def test_required_counters_gap_is_error_failure_is_fail():
    sc = _sc(counters=[r.model_dump() for r in R19])
    v = judge(sc, _obs(lease_rows(p_expired=(3.0, 3.0))), checks=[])
    assert v.verdict == "FAIL" and "counters:" in v.reason and "+0 (expected +1)" in v.reason
    v = judge(sc, _obs([]), checks=[])
    assert v.verdict == "ERROR" and "counters" in v.reason and "sampled 0 time(s)" in v.reason


def test_healthy_rule_fails_a_pass_scenario_when_d_counts_failures():
    v = judge(_sc(), _obs(lease_rows(d_failed=(0.0, 2.0))), checks=[])
    c = {c.name: c for c in v.checks}[HEALTHY_NAME]
    assert c.ok is False and f"decode {m.NIXL_FAILED_TRANSFERS} +2 (expected +0" in c.detail
    assert v.verdict == "FAIL" and HEALTHY_NAME in v.reason


def test_healthy_rule_is_not_required_and_skips_faults_and_known_issues():
    v = judge(_sc(), _obs([]), checks=[])  # ERROR: the edge kind's own checks are missing here
    assert {c.name: c.ok for c in v.checks}[HEALTHY_NAME] is None
    assert HEALTHY_NAME not in required_checks(_sc()) and HEALTHY_NAME not in v.reason
    fault = ScenarioConfig.model_validate({"name": "f", "kind": "fault", "decode": "decode", "prompt_tokens": 8,
                                           "max_tokens": 2, "fault": {"faults": [
                                               {"trigger": {"event": "prefill-answered"}, "target": "request",
                                                "action": "abandon"}]}})
    assert HEALTHY_NAME not in {c.name for c in judge(fault, _obs(lease_rows()), checks=[]).checks}
    ki = {"id": "k", "title": "t", "affects": ">=0.32.0,<0.33", "symptom": {"kind": "wrong-output"}}
    sc = ScenarioConfig.model_validate({**_sc().model_dump(exclude_none=True), "known_issue": ki})
    assert HEALTHY_NAME not in {c.name for c in judge(sc, _obs(lease_rows()), checks=[]).checks}
    # a scenario's own rule on D's failure counter replaces the generic one
    own = _sc(counters=[{"instance": "decode", "metric": m.NIXL_FAILED_TRANSFERS, "max": 5}])
    names = [c.name for c in judge(own, _obs(lease_rows(d_failed=(0.0, 2.0))), checks=[]).checks]
    assert "counters" in names and HEALTHY_NAME not in names


def test_by_version_counters_are_required_on_that_version_only():
    rule = {"instance": "prefill", "metric": m.NIXL_EXPIRED, "delta": 1}
    sc = _sc(by_version=[{"vllm": "<0.30", "completion_tokens": 2, "total_tokens": 10, "counters": [rule]}])
    old = _obs([])
    old.vllm_version, old.versions = "0.27.1", {"prefill": "0.27.1", "decode": "0.27.1"}
    v = judge(sc, old, checks=[])
    assert "counters" in {c.name for c in v.checks} and f"; counters prefill {m.NIXL_EXPIRED} not checked" in v.reason
    v = judge(sc, _obs([]), checks=[])  # 0.32.0: the base outcome, no rule
    assert "counters" not in {c.name for c in v.checks} and "counters" not in v.reason


def test_if_present_leaves_an_absent_counter_out_but_still_judges_a_present_one():
    """A supporting counter an older vLLM lacks (0.27.1: no notifications-after-expiry) is left out,
    named in the check; the same rule on an instance that has the counter must still hold."""
    from rig.config.expectations import CounterRule
    from rig.judge.counter_rules import counter_rules_check

    def rows(**counters):
        return [{"instance": "prefill", "life": 1, "counters": {k: v0 for k, (v0, _) in counters.items()}},
                {"instance": "prefill", "life": 1, "counters": {k: v1 for k, (_, v1) in counters.items()}}]

    split = CounterRule(instance="prefill", metric="vllm:nixl_num_kv_expired_reqs_total", delta=1)
    extra = CounterRule(instance="prefill", metric="vllm:nixl_num_notifications_after_expiry_total", min=1,
                        if_present=True)
    old = rows(**{"vllm:nixl_num_kv_expired_reqs_total": (0.0, 1.0)})
    c = counter_rules_check(old, [split, extra], "prefill", "decode")
    assert c.ok is True and "if_present: left out" in c.detail, c.detail
    strict = extra.model_copy(update={"if_present": False})
    assert counter_rules_check(old, [split, strict], "prefill", "decode").ok is None
    new = rows(**{"vllm:nixl_num_kv_expired_reqs_total": (0.0, 1.0),
                  "vllm:nixl_num_notifications_after_expiry_total": (0.0, 0.0)})
    c = counter_rules_check(new, [split, extra], "prefill", "decode")
    assert c.ok is False and "notifications_after_expiry" in c.detail, c.detail
    # every rule absent: nothing was looked at -> not checked, never ok
    assert counter_rules_check(old[:0] + rows(), [extra], "prefill", "decode").ok is None


# -------------------------------------------------------------------------------------------------
# A counter rule or a stall watcher that saw nothing never reads ok (rig/judge/counter_rules.py,
# rig/observe/stall.py's watch loop). Written against `make mutation` survivors (docs/howto/mutation.md).

FAILED_T = "vllm:nixl_num_failed_transfers_total"


def lrow(inst: str, counters: dict[str, float] | None, life: float | None = 1.0) -> dict:
    return {"instance": inst, "life": life, "counters": counters}


def rule(**kw) -> CounterRule:
    return CounterRule(instance=kw.pop("instance", "decode"), metric=kw.pop("metric", FAILED_T), **kw)


@pytest.mark.parametrize("rows", [
    [],
    [lrow("decode", {FAILED_T: 0.0})],  # sampled once
    [lrow("decode", {FAILED_T: 0.0}), lrow("decode", {"vllm:other_total": 1.0})],  # the metric in one sample only
    [lrow("decode", {FAILED_T: 0.0}), lrow("decode", None)],  # a sample without counters does not count
    [lrow("decode", {FAILED_T: 0.0}, life=1.0), lrow("decode", {FAILED_T: 0.0}, life=2.0)],  # one sample per life
    [lrow("prefill", {FAILED_T: 0.0}), lrow("prefill", {FAILED_T: 0.0})],  # the other instance's samples
], ids=["none", "once", "one-with-metric", "no-counters", "one-per-life", "other-instance"])
def test_a_delta_0_rule_measured_on_fewer_than_two_samples_is_not_checked(rows):
    ok, detail = rule_state(rows, rule(delta=0), "prefill", "decode")
    assert ok is None and "not checked" in detail, detail
    c = counter_rules_check(rows, [rule(delta=0)], "prefill", "decode")
    assert c.ok is None


def test_the_rise_is_last_minus_first_of_each_life_summed():
    rows = [lrow("decode", {FAILED_T: 1.0}, 1.0), lrow("decode", {FAILED_T: 2.0}, 1.0),
            lrow("decode", {FAILED_T: 4.0}, 1.0), lrow("decode", {FAILED_T: 10.0}, 2.0),
            lrow("decode", {FAILED_T: 13.0}, 2.0)]
    assert movement(rows, "decode", rule(min=1)) == (6.0, 2, "")
    assert movement(rows[:3], "decode", rule(delta=3)) == (3.0, 1, "")
    assert rule_state(rows[:3], rule(delta=3), "prefill", "decode")[0] is True
    assert rule_state(rows[:3], rule(delta=2), "prefill", "decode")[0] is False


def test_over_several_lives_only_a_lower_bound_holds():
    rows = [lrow("decode", {FAILED_T: 0.0}, 1.0), lrow("decode", {FAILED_T: 2.0}, 1.0),
            lrow("decode", {FAILED_T: 0.0}, 2.0), lrow("decode", {FAILED_T: 1.0}, 2.0)]
    ok, detail = rule_state(rows, rule(min=3), "prefill", "decode")
    assert ok is True and "a lower bound" in detail
    assert rule_state(rows, rule(min=4), "prefill", "decode")[0] is False  # below the bound: failed
    for r in (rule(delta=3), rule(max=5), rule(min=1, max=5)):
        ok, detail = rule_state(rows, r, "prefill", "decode")
        assert ok is None and "restarted (2 process lives)" in detail, r


def test_a_failure_is_named_with_the_rules_that_held_and_a_gap_is_never_ok():
    rows = [lrow("decode", {FAILED_T: 0.0}), lrow("decode", {FAILED_T: 1.0})]
    c = counter_rules_check(rows, [rule(delta=0), rule(max=5)], "prefill", "decode")
    assert c.ok is False and c.detail.startswith("decode " + FAILED_T + " +1 (expected +0)")
    c = counter_rules_check(rows, [rule(max=5), rule(metric="vllm:absent_total", delta=0)], "prefill", "decode")
    assert c.ok is None and c.detail.startswith("decode vllm:absent_total not checked")
    c = counter_rules_check(rows, [rule(metric="vllm:absent_total", delta=0, if_present=True)], "prefill", "decode")
    assert c.ok is None and "(if_present: left out)" in c.detail
    c = counter_rules_check(rows, [], "prefill", "decode")
    assert c.ok is None


def test_the_details_say_what_was_measured_and_why_not():
    rows = [lrow("decode", {FAILED_T: 0.0}), lrow("decode", {FAILED_T: 0.0})]
    assert rule_state(rows, rule(delta=0, why="healthy run"), "prefill", "decode") == (
        True, f"decode {FAILED_T} +0 (expected +0: healthy run)")
    assert rule_state(rows, rule(delta=0), "prefill", "decode") == (True, f"decode {FAILED_T} +0 (expected +0)")
    assert rule_state(rows, rule(metric="vllm:x_total", delta=0), "prefill", "decode") == (
        None, "decode vllm:x_total not checked: decode lacks vllm:x_total")
    assert rule_state(rows, rule(labels={"engine": "0"}, delta=0), "prefill", "decode") == (
        None, f"decode {FAILED_T}{{'engine': '0'}} not checked: decode lacks {FAILED_T} with labels {{'engine': '0'}}")
    two = [lrow("decode", {FAILED_T: 0.0}, 1.0), lrow("decode", {FAILED_T: 0.0}, 1.0),
           lrow("decode", {FAILED_T: 0.0}, 2.0), lrow("decode", {FAILED_T: 0.0}, 2.0)]
    assert rule_state(two, rule(delta=0), "prefill", "decode") == (
        None, f"decode {FAILED_T} +0 (expected +0) not checked: decode restarted (2 process lives), so increments "
              "between a life's last sample and its end are not seen")


def test_a_rule_names_a_role_or_an_instance():
    rows = [lrow("d-1", {FAILED_T: 0.0}), lrow("d-1", {FAILED_T: 1.0}),
            lrow("p-1", {FAILED_T: 0.0}), lrow("p-1", {FAILED_T: 0.0})]
    assert rule_state(rows, rule(instance="decode", delta=1), "p-1", "d-1") == (
        True, f"d-1 {FAILED_T} +1 (expected +1)")
    assert rule_state(rows, rule(instance="prefill", delta=0), "p-1", "d-1")[0] is True
    assert rule_state(rows, rule(instance="d-1", delta=1), "p-1", "d-1")[0] is True
    ok, detail = rule_state(rows, rule(instance="d-2", delta=0), "p-1", "d-1")
    assert ok is None and detail == (f"d-2 {FAILED_T} not checked: d-2 is not this scenario's prefill (p-1) or "
                                     "decode (d-1)")


def test_counter_rules_check_details_in_every_state():
    rows = [lrow("decode", {FAILED_T: 0.0}), lrow("decode", {FAILED_T: 1.0})]
    held = f"decode {FAILED_T} +1 (expected <= +5)"
    c = counter_rules_check(rows, [rule(max=5), rule(max=6)], "prefill", "decode")
    assert (c.ok, c.detail) == (True, f"{held}; decode {FAILED_T} +1 (expected <= +6)")
    c = counter_rules_check(rows, [rule(delta=0), rule(max=5), rule(metric="vllm:gone_total", delta=0)],
                            "prefill", "decode")
    assert (c.ok, c.detail) == (False, f"decode {FAILED_T} +1 (expected +0); {held} ok; decode vllm:gone_total not "
                                       "checked: decode lacks vllm:gone_total")
    c = counter_rules_check(rows, [rule(metric="vllm:gone_total", delta=0), rule(max=5)], "prefill", "decode")
    assert (c.ok, c.detail) == (None, f"decode vllm:gone_total not checked: decode lacks vllm:gone_total; {held} ok")
    gone = [rule(metric="vllm:a_total", delta=0, if_present=True), rule(metric="vllm:b_total", delta=0,
                                                                           if_present=True)]
    c = counter_rules_check(rows, gone, "prefill", "decode")
    assert (c.ok, c.detail) == (None, "not checked: decode vllm:a_total not checked: decode lacks vllm:a_total "
                                      "(if_present: left out); decode vllm:b_total not checked: decode lacks "
                                      "vllm:b_total (if_present: left out)")
    c = counter_rules_check(rows, [], "prefill", "decode", name="nixl-failed-transfers")
    assert (c.name, c.detail) == ("nixl-failed-transfers", "not checked: no counter rule")
    assert counter_rules_check(rows, gone, "prefill", "decode", name="x").name == "x"


# ------------------------------------------------------------------------- StallWatcher passes its settings on
