"""The hop-ordering routes in the explorer, without servers: an action with pd-retry /
pd-swallow-cancel steps is emitted as a sequence scenario that the config loads back; shrinking
tries the plain pd route; a step may not wait on a retry's answer; the mechanism of a retry that
answered wrong tokens over P's invalid-blocks line is ``stale-read:retry``, and the judge explains
P's line for a retry that answered the reference (rig.judge.sequence_checks.integrity_maps)."""

from __future__ import annotations

import yaml

from rig.config import RigConfig
from rig.config.sequence import Step
from rig.explore.emit import scenario_of, suite_yaml
from rig.explore.grammar import Action, Topology
from rig.explore.known import match_known
from rig.explore.mechanism import mechanism_of
from rig.explore.refusals import problems
from rig.explore.shrink import step_variants
from rig.judge.checks import Check, kv_integrity_check
from rig.judge.sequence_checks import integrity_maps, nothing_to_answer
from rig.judge.verdict import ScenarioVerdict
from rig.observe.observations import ScenarioObservation
from rig.observe.parity import ParityResult
from rig.transport.records import Hop, HopFailure, PDRecord
from rig.workload.sequence import SequenceEntry, SequenceResult
from tests.helpers.fake_rig import fake_config

TOPO = Topology(prefill="prefill", decode="decode", block_size=32, max_model_len=128, usable_blocks=15)
RETRY = Step(id="s0", route="pd-retry", prompt_tokens=40, max_tokens=4, retry_after_ms=100)
SWALLOW = Step(id="s1", route="pd-swallow-cancel", prompt_tokens=33, max_tokens=2, cancel_after_ms=(0, 0),
               start={"after": "s0", "event": "decode-sent"})
LINE = ("(EngineCore pid=1) ERROR 12-04 20:00:00 [pull_worker.py:668] Potentially invalid KV blocks for "
        "unrecognized request cmpl-p1-0 were retrieved by a decode worker. They may have expired.")


def test_an_ordering_action_is_emitted_as_a_sequence_the_config_loads(tmp_path):
    action = Action(index=0, steps=[RETRY, SWALLOW])
    sc = scenario_of(action, TOPO, "x00000")
    assert sc["kind"] == "sequence"
    text = suite_yaml([sc], "header")
    cfg = RigConfig.model_validate({**fake_config(tmp_path), "scenarios": yaml.safe_load(text)})
    steps = cfg.scenarios[0].sequence.steps
    assert steps == [RETRY, SWALLOW]
    assert "retry_after_ms: 100.0" in text and "route: pd-swallow-cancel" in text


def test_shrinking_tries_the_plain_route_first_after_count():
    for step in (RETRY, SWALLOW.model_copy(update={"start": None})):
        plain = [v for v in step_variants(step, TOPO) if v.route == "pd"]
        assert plain and plain[0].retry_after_ms is None and plain[0].cancel_after_ms is None
        assert plain[0].prompt_tokens == step.prompt_tokens


def test_no_step_waits_on_a_retry_s_answer():
    late = Step(id="s1", route="decode", prompt_tokens=8, max_tokens=2, start={"after": "s0", "event": "answered"})
    assert any("a retry refused cleanly" in p for p in problems(Action(index=0, steps=[RETRY, late]), TOPO))
    assert not problems(Action(index=0, steps=[RETRY, SWALLOW]), TOPO)


def _retried(outcome: str = "ok", parity: str = "diverged") -> tuple[ScenarioVerdict, ScenarioObservation,
                                                                     SequenceResult]:
    r = PDRecord(request_id="x1-s0-0", prompt_len=40, max_tokens=4, outcome=outcome)
    r.prefill = Hop(instance="prefill", status=200, token_ids=[1],
                    kv_transfer_params={"remote_request_id": "cmpl-p1-0"})
    r.first_decode = Hop(instance="decode").fail(HopFailure.CONNECTION_ERROR, "closed by the router 100 ms after it "
                                                                              "was sent (its timeout)")
    r.decode = Hop(instance="decode", status=200, token_ids=[5, 6, 7, 8]) if outcome == "ok" else \
        Hop(instance="decode", status=500).fail(HopFailure.HTTP_ERROR, "HTTP 500: internal")
    p = ParityResult(parity, position=0 if parity == "diverged" else None)
    obs = ScenarioObservation(scenario="x1", decode="decode", prefill="prefill", records=[r], parity=[p],
                              kv_integrity_lines={"prefill": [LINE]})
    result = SequenceResult(entries=[SequenceEntry("x1-s0-0", "s0", "pd-retry")])
    checks = [Check("parity", parity == "equal", "diverged", ("x1-s0-0",)),
              kv_integrity_check(obs, *integrity_maps(obs, result))]
    return ScenarioVerdict("x1", "FAIL", "pass", "", checks), obs, result


def test_a_retry_with_wrong_tokens_is_a_stale_read_of_cause_retry():
    v, obs, _ = _retried()
    assert v.checks[1].ok is False and v.checks[1].requests == ("x1-s0-0",)
    m = mechanism_of(v, obs, TOPO, {"prefill": "prefill", "decode": "decode"}, "FAIL parity []")
    assert (m.kind, m.key) == ("stale-read", "stale-read:retry")
    assert m.evidence["first_attempt"].startswith("closed by the router")
    # a known issue of cause retry explains it; a lease-expiry one does not (no hold past the lease)
    ki = [{"id": "lease", "symptom": {"kind": "stale-kv"}},
          {"id": "retry", "affects": ">=0.1", "symptom": {"kind": "stale-kv", "cause": "retry"}}]
    assert match_known(m, ki, "0.32.0").id == "retry"
    # without P's line it is a divergence, still marked as a retry's
    obs.kv_integrity_lines = {"prefill": []}
    assert mechanism_of(v, obs, TOPO, {}, "FAIL parity []").key.endswith(":retry")


def test_p_s_line_for_a_right_or_cleanly_refused_retry_is_explained():
    for outcome, parity in (("ok", "equal"), ("http_error", "refused")):
        _, obs, result = _retried(outcome, parity)
        c = kv_integrity_check(obs, *integrity_maps(obs, result))
        assert c.ok is True and "sent again with the same params (x1-s0-0)" in c.detail, c
    _, obs, _ = _retried("http_error", "refused")
    assert nothing_to_answer(obs)  # a refused retry is a clean failure: no answer was owed
    _, obs, _ = _retried("ok", "equal")
    assert not nothing_to_answer(obs)
