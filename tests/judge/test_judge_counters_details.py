"""counters-monotonic says what it saw, in every state (rig/judge/counters.py): the decreases with
their instance, series, values and time, the instances it could not attribute, the counts it
held over. Written against `make mutation` survivors (docs/howto/mutation.md)."""

from __future__ import annotations

from rig.judge.counters import counters_monotonic_check, decreases

S = "vllm:x_total"


def row(t: float, value: float, inst: str = "decode", life: float | None = 1.0, **more: float) -> dict:
    return {"t": t, "instance": inst, "life": life, "counters": {S: value, **more}}


def test_every_state_and_its_detail():
    c = counters_monotonic_check([])
    assert (c.name, c.ok, c.detail) == ("counters-monotonic", None,
                                        "not checked: no metrics timeline with counters was sampled")
    c = counters_monotonic_check([row(10.0, 1.0)])
    assert (c.name, c.ok, c.detail) == ("counters-monotonic", None,
                                        "not checked: no process life sampled twice (1 sample(s))")
    c = counters_monotonic_check([row(10.0, 1.0), row(11.0, 2.0, **{"vllm:y_total": 0.0})])
    assert (c.name, c.ok, c.detail) == ("counters-monotonic", True,
                                        "2 counter series never decreased over 2 samples in 1 process life(s)")
    c = counters_monotonic_check([row(10.0, 5.0, life=None), row(11.0, 4.0, life=None)])
    assert (c.name, c.ok) == ("counters-monotonic", None)
    assert c.detail == ("not checked: decode showed a counter drop but exposes no process_start_time_seconds, so a "
                        "restart cannot be told from a decrease")


def test_decreases_name_instance_series_values_and_time():
    rows = [row(10.0, 5.0), row(12.5, 4.0), row(20.0, 7.0, inst="prefill"), row(21.0, 6.0, inst="prefill")]
    found, blind = decreases(rows)
    assert found == [f"decode: {S} 5 -> 4 at +2.5 s", f"prefill: {S} 7 -> 6 at +1.0 s"] and blind == []
    assert decreases([{"counters": {S: 2.0}, "life": 1}, {"counters": {S: 1.0}, "life": 1}])[0] == [
        f"?: {S} 2 -> 1 at +0.0 s"]
    assert decreases([row(10.0, 2.0, life=None), row(11.0, 1.0, life=None), row(12.0, 0.0, life=None)]) == (
        [], ["decode"])


def test_more_than_three_decreases_are_cut_with_an_ellipsis():
    rows = [row(float(t), 10.0 - t) for t in range(5)]
    c = counters_monotonic_check(rows)
    assert c.ok is False and c.detail.startswith("4 counter decrease(s) within one process life: decode: ")
    assert c.detail.endswith(f"decode: {S} 8 -> 7 at +3.0 s; ...") and c.detail.count("->") == 3
    c = counters_monotonic_check(rows[:4])
    assert c.detail.endswith(f"decode: {S} 8 -> 7 at +3.0 s")
