"""Prompt resources against fake vLLM servers: a request reuses another request's prompt by name
(``same_as``: the same token IDs, N identical copies at once; ``head_of``: its first tokens),
within a sequence and across scenarios of one topology, and the token IDs that reach the servers
are those. Bad names are refused at load time with the fix."""

from __future__ import annotations

import pytest

from rig.cli import fresh_prompt_seeds
from rig.config import ConfigError, load_config
from rig.judge.sequence_checks import gauges_account_check
from rig.observe.metrics import MetricSnapshot, parse_metrics
from rig.run.runner import SuiteRunner, new_run_dir
from rig.workload.prompts import make_prompt, resolve
from rig.workload.sequence import SequenceResult
from tests.helpers.fake_rig import fake_config, write_config
from tests.helpers.survivors import kill_pids, wait_no_survivors

SCENARIOS = [
    {"name": "x-edge", "prompt_tokens": 40, "max_tokens": 4},
    {"name": "x-copies", "prompt_tokens": 40, "max_tokens": 4, "concurrent": 3, "same_as": "x-edge"},
    {"name": "reuse", "kind": "sequence", "require": ["gauges-account"], "sequence": {"steps": [
        {"id": "x", "route": "pd", "prompt_tokens": 64, "max_tokens": 4},
        {"id": "again", "route": "pd", "prompt_tokens": 64, "max_tokens": 4, "same_as": "x",
         "start": {"after": "x", "event": "answered"}},
        {"id": "burst", "route": "pd", "prompt_tokens": 64, "max_tokens": 4, "count": 4, "same_as": "x",
         "start": {"after": "again", "event": "answered"}},
        {"id": "head", "route": "decode", "prompt_tokens": 32, "max_tokens": 4, "head_of": "x-edge"},
    ]}},
    {"name": "other", "kind": "sequence", "sequence": {"steps": [
        {"id": "y", "route": "pd", "prompt_tokens": 64, "max_tokens": 4, "same_as": "reuse/burst"}]}},
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """One run of SCENARIOS; afterwards no fake server of it may survive."""
    tmp = tmp_path_factory.mktemp("fake-prompt-reuse")
    cfg = load_config(write_config(tmp, fake_config(tmp, scenarios=SCENARIOS)))
    run_dir = new_run_dir(cfg)
    yield SuiteRunner(cfg, list(cfg.scenarios), run_dir, quiet=True).run(), run_dir
    left = wait_no_survivors(str(tmp), within_s=10)
    kill_pids(left)
    assert left == {}, f"fake servers survived: {left}"


def prompts(result, scenario: str) -> dict[str, list[int]]:
    obs = next(o for o in result.observations if o.scenario == scenario)
    return {r.request_id: r.prompt for r in obs.records}


def test_reused_prompts_are_the_same_token_ids_and_reach_the_servers(suite):
    result, run_dir = suite
    assert result.error == ""
    edge, copies = prompts(result, "x-edge"), prompts(result, "x-copies")
    x = edge["x-edge-0"]
    assert len(x) == 40 and [copies[f"x-copies-{i}"] for i in range(3)] == [x, x, x]
    seq = prompts(result, "reuse")
    own = seq["reuse-x-0"]
    assert own != x[:len(own)]  # the step draws its own prompt: the reuse below is not a coincidence
    assert all(seq[rid] == own for rid in ("reuse-again-0", *(f"reuse-burst-{k}" for k in range(4))))
    assert seq["reuse-head-0"] == x[:32]
    assert prompts(result, "other")["other-y-0"] == own
    # D was sent the same IDs: x's prompt through P/D 1 + 1 + 4 (reuse) + 1 (other) times.
    sent = [ln.split("prompt ids: ", 1)[1] for ln in (run_dir / "logs" / "decode.log").read_text().splitlines()
            if "prompt ids: " in ln]
    assert sent.count(",".join(map(str, own))) == 7
    assert sent.count(",".join(map(str, x[:32]))) == 1  # head: straight to D
    reuse = next(v for v in result.verdicts if v.scenario == "reuse")
    gauges = next(c for c in reuse.checks if c.name == "gauges-account")
    assert gauges.ok is True and "counted every outstanding request" in gauges.detail, gauges.detail
    for v in result.verdicts:
        assert v.verdict in ("PASS", "FAIL"), (v.scenario, v.reason)
        # Every request answered; what D's prefix cache makes of the repeats is the scenario's to judge.
        assert next(c for c in v.checks if c.name == "completed").ok, (v.scenario, v.reason)


def test_attach_mode_salts_the_seeds_and_reuse_still_holds_within_the_run(tmp_path):
    cfg = load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=SCENARIOS)))
    salted = fresh_prompt_seeds(cfg, "run-2")
    by = {sc.name: sc for sc in salted.scenarios}
    fresh = resolve(salted.scenarios, by["x-edge"], None, 0)
    assert fresh != resolve(cfg.scenarios, cfg.scenarios[0], None, 0)  # a new run draws new prompts
    assert resolve(salted.scenarios, by["x-copies"], None, 2) == fresh  # ... and reuses them
    reuse = by["reuse"]
    steps = {s.id: s for s in reuse.sequence.steps}
    assert resolve(salted.scenarios, reuse, steps["head"], 0) == fresh[:32]


def test_the_seed_rule_a_shorter_prompt_is_a_prefix_of_a_longer_one():
    assert make_prompt(32, 5) == make_prompt(96, 5)[:32]
    assert make_prompt(32, 5) != make_prompt(32, 6)


@pytest.mark.parametrize(("change", "message"), [
    ({"same_as": "nowhere"}, r"x-copies.same_as 'nowhere': no scenario 'nowhere'"),
    ({"prompt_tokens": 39}, r"that prompt has 40 tokens, prompt_tokens is 39; set prompt_tokens: 40, or use "
                            "head_of"),
    ({"same_as": None, "head_of": "x-edge", "prompt_tokens": 41}, r"prompt_tokens 41 is longer than that prompt"),
    ({"same_as": "reuse"}, r"scenario 'reuse' is of kind sequence; name an edge or fault scenario"),
    ({"same_as": "reuse/nope"}, r"scenario 'reuse' has no step 'nope'"),
    ({"head_of": "x-edge"}, r"same_as and head_of: give one"),
])
def test_bad_prompt_names_are_refused_with_the_fix(tmp_path, change, message):
    scenarios = [dict(s) for s in SCENARIOS]
    scenarios[1].update(change)
    with pytest.raises(ConfigError, match=message):
        load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=scenarios)))


@pytest.mark.parametrize("built", [{"prefix_of": "w"}, {"repeat_of": "w"},
                                   {"transform": {"append_first_token": True}}])
def test_a_step_whose_prompt_is_built_during_the_run_cannot_be_named(tmp_path, built):
    # prefix_of / repeat_of / transform: the step's prompt (or the one D got) is not its seed's,
    # so same_as / head_of could not rebuild it.
    steps = [{"id": "w", "route": "decode", "prompt_tokens": 32, "max_tokens": 2},
             {"id": "b", "route": "pd" if "transform" in built else "decode", "prompt_tokens": 64,
              "max_tokens": 2, **built, "start": {"after": "w", "event": "answered"}},
             {"id": "c", "route": "pd", "prompt_tokens": 64, "max_tokens": 2, "same_as": "b",
              "start": {"after": "b", "event": "answered"}}]
    if "repeat_of" in built:
        steps[1]["prompt_tokens"] = steps[2]["prompt_tokens"] = 32
    field = next(iter(built))
    scenarios = [{"name": "s", "kind": "sequence", "sequence": {"steps": steps}}]
    with pytest.raises(ConfigError, match=rf"s.sequence.steps\[c\].same_as 'b': s/b has {field} "
                                          r"\(its prompt is built"):
        load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=scenarios)))


def test_a_step_takes_one_prompt_source(tmp_path):
    steps = [{"id": "w", "route": "decode", "prompt_tokens": 32, "max_tokens": 2},
             {"id": "b", "route": "decode", "prompt_tokens": 64, "max_tokens": 2, "prefix_of": "w",
              "head_of": "w", "start": {"after": "w", "event": "answered"}}]
    scenarios = [{"name": "s", "kind": "sequence", "sequence": {"steps": steps}}]
    with pytest.raises(ConfigError, match=r"head_of and prefix_of: give one prompt source"):
        load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=scenarios)))


def test_a_cycle_of_names_is_refused(tmp_path):
    scenarios = [{"name": "a", "prompt_tokens": 8, "max_tokens": 2, "same_as": "b"},
                 {"name": "b", "prompt_tokens": 8, "max_tokens": 2, "same_as": "a"}]
    with pytest.raises(ConfigError, match=r"a.same_as 'b': the names form a cycle \(a -> b -> a\)"):
        load_config(write_config(tmp_path, fake_config(tmp_path, scenarios=scenarios)))


def _d(running: int, waiting: int, fetch: int | None) -> MetricSnapshot:
    text = f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
    if fetch is not None:
        text += f'vllm:num_requests_kv_fetch_by_stage{{stage="waiting_to_start"}} {fetch}\n'
    return parse_metrics(text, "decode")


def test_gauges_account_fails_on_a_request_d_counts_nowhere_for_the_window():
    """vLLM PR #56640's symptom: a request parked in WAITING_FOR_REMOTE_KVS on a build that counts
    it in no gauge; a short gap (a request on its way into the engine) is not a failure."""
    seen = SequenceResult(gauge_window_s=2.0)
    seen.gauges.feed(_d(0, 0, 0), 1, 0.0, 0.0)  # just sent: not yet in D's engine
    seen.gauges.feed(_d(0, 1, 1), 1, 0.5, 500.0)  # waiting and fetching: counted once
    seen.gauges.feed(_d(1, 0, None), 1, 1.0, 1000.0)
    seen.gauges.feed(_d(0, 0, 0), 0, 1.5, 1500.0)  # nothing outstanding: no sample
    assert seen.gauges.samples == 3
    assert gauges_account_check(seen).ok is True
    hidden = SequenceResult(gauge_window_s=2.0)
    for i in range(6):
        hidden.gauges.feed(_d(1, 0, 0), 2, 0.5 * i, 500.0 * i)  # one of two requests invisible for 2.5 s
    check = gauges_account_check(hidden)
    assert check.ok is False and "D's gauges showed 1 of 2 outstanding requests for 2.5 s" in check.detail
    assert gauges_account_check(SequenceResult(gauge_window_s=2.0)).ok is None
