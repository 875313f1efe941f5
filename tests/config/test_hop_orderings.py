"""The routes of other routers' hop orderings in the scenario language (rig/config/sequence.py):
``pd-retry`` needs ``retry_after_ms`` and only it takes one, ``pd-swallow-cancel`` needs
``cancel_after_ms``; neither takes a transform or an expected status; their events; the idle bound
they set; the reason "decode before P's answer" is no route, in ROUTE_EVENTS' docstring."""

from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError

import rig.config.sequence as sequence_module
from rig.config.sequence import ROUTE_EVENTS, SequenceConfig, Step
from rig.explore.grammar import ROUTE_WEIGHTS, step_dict


def _step(**kw) -> Step:
    return Step.model_validate({"id": "s", "prompt_tokens": 40, "max_tokens": 4, **kw})


def test_the_ordering_routes_load_and_describe_themselves():
    retry = _step(route="pd-retry", retry_after_ms=100)
    assert retry.events() == ("sent", "prefill-answered", "decode-sent", "answered")
    assert retry.describe() == "s: pd-retry 40+4 x1 at the start decode retried after 100ms"
    swallow = _step(route="pd-swallow-cancel", count=2, cancel_after_ms=(20, 200))
    assert swallow.cancel_at_ms(1) == 200
    assert swallow.describe().endswith("cancelled at 20-200ms (swallowed by the router)")
    # emitted YAML carries the new field, and loads back to the same step
    assert step_dict(retry) == {"id": "s", "route": "pd-retry", "prompt_tokens": 40, "max_tokens": 4,
                                "retry_after_ms": 100.0}
    assert Step.model_validate(step_dict(retry)) == retry
    assert {"pd-retry", "pd-swallow-cancel"} <= set(ROUTE_WEIGHTS) and set(ROUTE_WEIGHTS) <= set(ROUTE_EVENTS)


@pytest.mark.parametrize("kw, words", [
    ({"route": "pd-retry"}, "(route pd-retry): give retry_after_ms"),
    ({"route": "pd", "retry_after_ms": 10}, "retry_after_ms retries the decode hop; set route: pd-retry"),
    ({"route": "decode", "retry_after_ms": 10}, "set route: pd-retry"),
    ({"route": "pd-retry", "retry_after_ms": -1}, "retry_after_ms"),
    ({"route": "pd-swallow-cancel"}, "(route pd-swallow-cancel): give cancel_after_ms"),
    ({"route": "pd-retry", "retry_after_ms": 0, "cancel_after_ms": (0, 0)}, "cancel_after_ms cancels a P/D request"),
    ({"route": "pd-retry", "retry_after_ms": 0, "expect_status": 400}, "expect_status does not apply"),
    ({"route": "pd-swallow-cancel", "cancel_after_ms": (5, 5), "transform": {"append_first_token": True}},
     "transform needs route pd"),
])
def test_bad_ordering_steps_are_refused_with_the_fix(kw, words):
    with pytest.raises(ValidationError) as e:
        _step(**kw)
    assert words in str(e.value)


def test_the_idle_bound_follows_what_the_route_leaves_to_p_s_lease():
    def seq(**kw) -> SequenceConfig:
        return SequenceConfig(steps=[_step(**kw)])

    # a retry closes its first attempt: P may hold that pull's blocks until the lease
    assert seq(route="pd-retry", retry_after_ms=0).cancels
    # a swallowed cancel cuts nothing: its hops end by themselves
    assert not seq(route="pd-swallow-cancel", cancel_after_ms=(0, 0)).cancels
    assert seq(route="pd", cancel_after_ms=(0, 0)).cancels


def test_a_later_step_may_start_on_any_event_of_an_ordering_route():
    spec = SequenceConfig.model_validate({"steps": [
        {"id": "r", "route": "pd-retry", "prompt_tokens": 40, "max_tokens": 4, "retry_after_ms": 20},
        {"id": "w", "route": "pd-swallow-cancel", "prompt_tokens": 40, "max_tokens": 4, "cancel_after_ms": [0, 0],
         "start": {"after": "r", "event": "decode-sent"}},
        {"id": "d", "route": "decode", "prompt_tokens": 40, "max_tokens": 4,
         "start": {"after": "w", "event": "answered"}}]})
    assert [s.route for s in spec.steps] == ["pd-retry", "pd-swallow-cancel", "decode"]


def test_route_events_says_why_no_route_sends_the_decode_hop_first():
    src = inspect.getsource(sequence_module)
    told = src[src.index("ROUTE_EVENTS: dict"):src.index("class StartRule")]
    assert "remote_block_ids" in told and "nixl_connector.py" in told and "``pd-retry`` exercises" in told
    assert "pd-retry" in (sequence_module.__doc__ or "") and "pd-swallow-cancel" in (sequence_module.__doc__ or "")
