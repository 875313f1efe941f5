"""Wave scenarios, and a wave run as the runner runs it (the wave, the drains, the verdict), for the
waves' tests and the verdict cases."""

from __future__ import annotations

from pathlib import Path

import httpx

from rig.config import ScenarioConfig
from rig.judge import wave_checks as wj
from rig.observe import drain
from rig.observe import metrics as m
from rig.observe.observations import ScenarioObservation, SnapshotStore, TransferEvidence
from rig.report.build import verdict_report, wave_report
from rig.report.wave_section import wave_section
from rig.workload import waves as wv


def scenario(kind: str, name: str = "w", **wave) -> ScenarioConfig:
    top = {k: wave.pop(k) for k in ("prompt_tokens", "max_tokens", "seed", "parity") if k in wave}
    return ScenarioConfig.model_validate({"name": name, "kind": kind, "wave": wave, **top})


async def wave_and_drain(sc, p, d, tmp: Path, drain_s: float = 5.0, block_size: int = 16,
                         usable: dict | None = None):
    """What the runner / CLI do: run the wave, check drains, judge."""
    async with httpx.AsyncClient(timeout=5) as http:
        store = SnapshotStore(tmp)
        try:
            before = {e.name: await m.scrape(http, e.url, e.name) for e in (p, d)}
            res = await wv.run_wave(sc, "tiny", [p], [d], http, store, tmp / "waves", deadline_s=10,
                                    usable_blocks=usable or {"prefill": 999, "decode": 999},
                                    block_size=block_size, max_model_len=2048, progress="off")
            after = await m.scrape(http, d.url, d.name)
            drains = await drain.check_drains(http, [p, d], res.baseline_kv, drain_s, interval_s=0.1)
        finally:
            store.close()
    # As the runner fills it: both logs scanned (nothing found), P and D versions known.
    obs = ScenarioObservation(sc.name, d.name, p.name, drains=drains,
                              evidence=TransferEvidence.between(before[d.name], after),
                              fatal_lines={p.name: [], d.name: []}, kv_integrity_lines={p.name: [], d.name: []},
                              timeline=store.rows_of(sc.name))
    v = wj.judge_wave(sc, obs, res)
    return res, obs, v, [wave_section(wave_report(res), verdict_report(v))]
