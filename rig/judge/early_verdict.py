"""An early stall verdict by reasoning, not waiting.

The stall window (``timeouts.stall_window_s``, 8 s on the CPU default) is what the rig waits when it
knows nothing about why a request does not move. For an admission stall it can know more:

1. the block arithmetic (:func:`rig.judge.signatures.admission_of`): each outstanding request's first
   decode step needs ``cdiv(min(n + 1 + k, max_model_len), block_size)`` blocks, no more than
   the free ones (usable x (1 - KV usage)), yet D keeps it waiting for capacity with its KV
   fetch not started (``kv_fetch waiting_to_start``) and nothing running;
2. evidence that D's scheduler had every chance to admit it: vLLM's EngineCore steps in a busy
   loop while any request is waiting (``EngineCore.run_busy_loop`` -> ``step`` ->
   ``scheduler.schedule``, vllm/v1/engine/core.py 0.32.0), so its process's CPU time grows with
   scheduler iterations. 0.32.0 exposes no counter of engine steps on ``/metrics``
   (``vllm:iteration_tokens_total`` is observed only for steps that computed tokens), so the
   rig reads the EngineCore's CPU seconds from ``/proc`` (:meth:`rig.cluster.processes.Cluster.engine_cpu_s`);
3. the state stayed frozen over several samples spanning at least ``min_frozen_s``.

A request admitted normally leaves this state in one scheduler iteration (its blocks are
allocated and its fetch goes ``in_progress``, KV usage > 0), and the gauges follow every step:
with stats logging on, the scheduler returns its stats each step "even if there are no request
outputs" (``Scheduler.update_from_output``, vllm/v1/core/sched/scheduler.py 0.32.0). So a control
that merely waits for CPU shows no EngineCore CPU growth and is left to the window. Without CPU evidence (attached
instances, a kernel that hides /proc) the rule never decides: the window does.
"""

from __future__ import annotations

from dataclasses import dataclass

from rig.config.blocks import BlockFacts
from rig.judge.signatures import admission_of
from rig.observe.stall import StallFacts


@dataclass(frozen=True)
class AdmissionReasoning:
    """Early rule for :class:`rig.observe.stall.StallWatcher` / ``StallDetector`` (``early=``):
    decides a stall when every
    outstanding request (``prompt_lens``, tokens) fits the free blocks of D (``blocks``) yet waits
    for capacity with its KV fetch not started, KV usage <= ``kv_usage_max`` (0..1), the state
    frozen for >= ``min_frozen_s`` seconds over >= ``min_samples`` snapshots while D's EngineCore
    used >= ``min_engine_cpu_s`` CPU seconds. Returns the evidence text, or None."""

    blocks: BlockFacts
    prompt_lens: tuple[int, ...]
    min_frozen_s: float = 1.0
    min_samples: int = 4
    # An admission takes one scheduler step, and 0.05 CPU-s is many steps. A frozen D's EngineCore
    # still uses a little CPU (it sleeps 1 ms after each step that ran no model); what it used in
    # the 0.32.0 livelock, and why the threshold was lowered to this: docs/measurements.md.
    min_engine_cpu_s: float = 0.05
    kv_usage_max: float = 0.05

    def __post_init__(self) -> None:
        if self.min_frozen_s <= 0 or self.min_samples < 2 or self.min_engine_cpu_s <= 0:
            raise ValueError("AdmissionReasoning: min_frozen_s and min_engine_cpu_s must be > 0 and "
                             f"min_samples >= 2 (got {self.min_frozen_s}, {self.min_engine_cpu_s}, "
                             f"{self.min_samples})")

    def __call__(self, facts: StallFacts, frozen_s: float, samples: int, engine_cpu_s: float | None) -> str | None:
        if engine_cpu_s is None or not self.prompt_lens:
            return None
        if frozen_s < self.min_frozen_s or samples < self.min_samples or engine_cpu_s < self.min_engine_cpu_s:
            return None
        if (facts.running != 0 or facts.kv_usage > self.kv_usage_max
                or facts.kv_fetch_stages.get("waiting_to_start", 0) <= 0
                or facts.kv_fetch_stages.get("in_progress", 0) > 0):
            return None
        arith = []
        for n in sorted(set(self.prompt_lens)):
            finding, text = admission_of(n, self.blocks, facts)
            if finding != "fits-but-waits":
                return None
            arith.append(text)
        return (f"block arithmetic ({'; '.join(arith)}) and D's EngineCore busy for {engine_cpu_s:.2f} CPU-s "
                f"(scheduler iterations) while the state stayed frozen {frozen_s:.1f} s over {samples} samples")
