"""The rules a scenario must keep against the instances it runs on (a part of
:meth:`rig.config.topology.RigConfig._consistent`): the instances it names exist in their role, its
prompts fit their ``max_model_len``, a stale-kv known issue can happen. Each raises ValueError
naming the field and the fix (pydantic turns it into one ConfigError line)."""

from __future__ import annotations

from typing import Protocol

from rig.config.expectations import StaleKvSignature
from rig.config.instances import InstanceConfig
from rig.config.scenarios import ScenarioConfig


class Instances(Protocol):
    """What the rules read of the config (rig.config.topology.RigConfig): the instances by role,
    each one's ``max_model_len`` (tokens) and NIXL lease (seconds)."""

    prefill: list[InstanceConfig]
    decode: list[InstanceConfig]

    def max_model_len_of(self, inst: InstanceConfig | str) -> int:
        """The instance's ``max_model_len`` (tokens)."""
        ...

    def lease_s_of(self, name: str) -> float:
        """The instance's NIXL ``kv_lease_duration`` (seconds)."""
        ...


def check_scenario_refs(cfg: Instances, i: int, sc: ScenarioConfig, names: list[str]) -> None:
    """Scenario ``i`` names instances of the right role: its pair, fault targets, counter rules."""
    for role, ref, pool in (("prefill", sc.prefill, cfg.prefill), ("decode", sc.decode, cfg.decode)):
        if ref is not None and ref not in {x.name for x in pool}:
            raise ValueError(
                f"scenarios[{i}] ({sc.name}).{role} names {ref!r}, which is not a {role} "
                f"instance; choose one of {[x.name for x in pool]}")
    for f in (sc.fault.faults if sc.fault else []):
        if f.target not in ("prefill", "decode", "request", *names):
            raise ValueError(f"scenarios[{i}] ({sc.name}).fault target {f.target!r}: give prefill, decode, "
                             f"request or an instance name ({names})")
    for rule in [r for o in (sc.expect, *sc.expect.by_version) for r in o.counters]:
        # Only the scenario's own pair is sampled over it (rig.judge.counter_rules.rule_state):
        # another instance's rule could never be judged, so the run would end ERROR.
        pair = (sc.prefill or cfg.prefill[0].name, sc.decode or cfg.decode[0].name)
        if rule.instance not in ("prefill", "decode", *pair):
            raise ValueError(f"scenarios[{i}] ({sc.name}).expect.counters instance {rule.instance!r}: "
                             f"give prefill, decode or this scenario's pair {list(pair)} (only they are "
                             "sampled over the scenario)")


def check_scenario_lengths(cfg: Instances, i: int, sc: ScenarioConfig) -> None:
    """Scenario ``i``'s prompts and completions fit the max_model_len of its prefill and decode (tokens)."""
    p_mml = cfg.max_model_len_of(sc.prefill or cfg.prefill[0].name)
    d_mml = cfg.max_model_len_of(sc.decode or cfg.decode[0].name)
    if sc.prompt_tokens >= p_mml:
        raise ValueError(
            f"scenarios[{i}] ({sc.name}).prompt_tokens {sc.prompt_tokens} must be below "
            f"max_model_len {p_mml} (prefill's; vLLM rejects it otherwise)")
    if sc.prompt_tokens >= d_mml and sc.expect.http_status is None and sc.sequence is None:
        # (a sequence's steps are checked one by one below, with their expect_status)
        raise ValueError(
            f"scenarios[{i}] ({sc.name}).prompt_tokens {sc.prompt_tokens} is not below decode's "
            f"max_model_len {d_mml}: decode refuses the decode hop with HTTP 400; if that is the point, "
            "set expect.http_status: 400, else shorten the prompt")
    if sc.max_tokens > max(p_mml, d_mml):
        raise ValueError(
            f"scenarios[{i}] ({sc.name}).max_tokens {sc.max_tokens} exceeds max_model_len "
            f"{max(p_mml, d_mml)}: no completion can be longer than the context; lower max_tokens")
    room = d_mml - sc.prompt_tokens
    if (sc.sequence is None and sc.parity and sc.expect.http_status is None and d_mml < p_mml
            and 0 < room < sc.max_tokens):
        # vLLM (0.32.0, entrypoints/serve/utils/api_utils.py get_max_tokens) clamps max_tokens to
        # the room D has left, while the reference on prefill, with its larger max_model_len, is
        # not clamped: the answers differ in length and parity would fail a correct decode.
        raise ValueError(
            f"scenarios[{i}] ({sc.name}): prompt_tokens {sc.prompt_tokens} + max_tokens {sc.max_tokens} "
            f"exceeds decode's max_model_len {d_mml} (prefill's is {p_mml}): decode clamps the "
            f"completion to {room} tokens and the reference does not; lower max_tokens to {room}, or "
            f"test the clamp with parity: false and expect.completion_tokens: {room}")
    mml = min(p_mml, d_mml)
    for j, st in enumerate(sc.sequence.steps if sc.sequence else []):  # kind sequence (bug record R02, R06)
        plus = 1 if st.appends else 0  # D's prompt carries P's first token (transform)
        # A step that expects a refusal (expect_status) may exceed D's max_model_len on purpose
        # (D refuses with 400); P's must still hold it.
        if st.expect_status is not None and st.prompt_tokens >= p_mml:
            raise ValueError(
                f"scenarios[{i}] ({sc.name}).sequence.steps[{j}] ({st.id}): prompt_tokens {st.prompt_tokens} "
                f"must be below prefill's max_model_len {p_mml} (P computes it before D refuses it)")
        if st.expect_status is None and st.prompt_tokens + plus + st.max_tokens > mml:
            what = " + P's appended token" if plus else ""
            raise ValueError(
                f"scenarios[{i}] ({sc.name}).sequence.steps[{j}] ({st.id}): prompt_tokens {st.prompt_tokens}"
                f"{what} + max_tokens {st.max_tokens} = {st.prompt_tokens + plus + st.max_tokens} exceeds "
                f"max_model_len {mml}; shorten the prompt or lower max_tokens")


def decode_n(sc: ScenarioConfig) -> list[int]:
    """The ``n`` each decode hop of scenario ``sc`` asks for: its ``request`` fields' (edge and
    fault kinds) and every sequence step's (``all`` then ``decode``, as RequestFields.for_hop);
    a hop that sets none asks for 1."""
    fields = [sc.request] + [st.request for st in (sc.sequence.steps if sc.sequence else [])]
    return [int(f.for_hop("decode").get("n") or 1) for f in fields if f is not None]


def check_stale_kv(cfg: Instances, i: int, sc: ScenarioConfig) -> None:
    """A stale-kv known issue of scenario ``i`` can happen: shared-params needs several prompts in
    one request; decode-children needs ``n`` > 1 on a decode hop; retry a pd-retry step;
    lease-expired needs a hold (a fault or hold_between_s) longer than the NIXL lease. Raises
    ValueError naming the field."""
    lease = cfg.lease_s_of(sc.prefill or cfg.prefill[0].name)
    symptom = sc.known_issue.symptom if sc.known_issue else None
    if isinstance(symptom, StaleKvSignature) and symptom.cause == "shared-params":
        # The second read of one prompt's blocks, not a lease expiry: no hold needed, but
        # the request must carry several prompts for one prompt's params to be shared.
        if sc.request is None or sc.request.prompts < 2:
            raise ValueError(
                f"scenarios[{i}] ({sc.name}).known_issue.symptom.cause shared-params needs several "
                f"prompts in one request; set request.prompts to 2 or more, or use cause "
                "lease-expired")
    elif isinstance(symptom, StaleKvSignature) and symptom.cause == "decode-children":
        # Every child of D's parallel-sampling split reads P's blocks: no hold needed, but some
        # decode hop must ask for n > 1 (the edge kind's request, or a sequence step's).
        if max(decode_n(sc), default=1) < 2:
            raise ValueError(
                f"scenarios[{i}] ({sc.name}).known_issue.symptom.cause decode-children needs n > 1 on the "
                "decode hop; set request.decode.n: 2 (or a sequence step's), or use cause lease-expired")
    elif isinstance(symptom, StaleKvSignature) and symptom.cause == "retry":
        # The retry's read of blocks the first attempt's done notice freed: no hold needed.
        if not any(st.route == "pd-retry" for st in (sc.sequence.steps if sc.sequence else [])):
            raise ValueError(f"scenarios[{i}] ({sc.name}).known_issue.symptom.cause retry needs a sequence step "
                             "with route pd-retry (a decode hop sent again with the same params)")
    elif sc.known_issue and sc.known_issue.symptom.kind == "stale-kv" and sc.fault is not None:
        held = max((f.stop_s or f.delay_s or 0 for f in sc.fault.faults), default=0)
        if held <= lease:
            raise ValueError(
                f"scenarios[{i}] ({sc.name}): a stale-kv known issue needs a fault that holds the exchange "
                f"(sigstop stop_s or delay-decode delay_s) longer than nixl.kv_lease_duration {lease:g}; "
                f"the longest is {held:g} s")
    elif sc.known_issue and sc.known_issue.symptom.kind == "stale-kv" and (sc.hold_between_s or 0) <= lease:
        raise ValueError(
            f"scenarios[{i}] ({sc.name}).hold_between_s {sc.hold_between_s} must exceed "
            f"nixl.kv_lease_duration {lease:g} for the lease to expire; lower the lease, e.g. "
            "--set nixl.kv_lease_duration=5, or hold longer")
