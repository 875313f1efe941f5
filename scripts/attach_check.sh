#!/usr/bin/env bash
# The attach-mode check of docs/howto/attach.md, by hand: `pdrig up` on the CPU default, then
# `pdrig e2e --attach` against its endpoints three times: log sources as file paths (the verdicts
# of a normal run), a fatal line planted in D's log during a scenario (FAIL on no-fatal-log), and
# no log sources (the log checks are "not checked"). Starts live vLLM servers (~35 s); stops them.
#   bash scripts/attach_check.sh            (from the repository root, after `make setup`)
set -u
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/attach-check}
CONFIG=configs/cpu-tiny.yaml
rm -rf "$OUT"; mkdir -p "$OUT"
"$PY" -m rig.cli up -c $CONFIG --instances prefill,decode --set run_root="$OUT" > "$OUT/up.out" 2>&1 &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP' EXIT
t0=$(date +%s)
until ls "$OUT"/*-up/endpoints.json >/dev/null 2>&1; do
  sleep 1
  kill -0 $UP 2>/dev/null || { echo "pdrig up exited:"; cat "$OUT/up.out"; exit 1; }
  (( $(date +%s) - t0 < 300 )) || { echo "pdrig up not ready after 300 s"; exit 1; }
done
echo "pdrig up ready after $(( $(date +%s) - t0 )) s"
UPD=$(ls -d "$OUT"/*-up)
ATTACH=(e2e -c $CONFIG --attach --endpoint prefill=http://127.0.0.1:8100 --endpoint decode=http://127.0.0.1:8200)
LOGS=(--log "prefill=file:$UPD/logs/prefill.log" --log "decode=file:$UPD/logs/decode.log")
echo "=== 1. log sources as file paths"
"$PY" -m rig.cli "${ATTACH[@]}" "${LOGS[@]}" --set run_root="$OUT/1" \
  --scenario edge-96-block-boundary --scenario edge-126
echo "rc=$?"
echo "=== 2. a fatal line planted in D's log while the decode hop is held 3 s"
( until grep -q "scenario edge-96-block-boundary" "$OUT/2.err" 2>/dev/null; do sleep 0.1; done
  sleep 1
  echo "ERROR [block_pool.py:679] Cannot get 3 free blocks from the pool (planted)" >> "$UPD/logs/decode.log" ) &
"$PY" -m rig.cli "${ATTACH[@]}" "${LOGS[@]}" --set run_root="$OUT/2" --scenario edge-96-block-boundary \
  --set scenarios.edge-96-block-boundary.hold_between_s=3 2> "$OUT/2.err"
echo "rc=$?"
echo "=== 3. no log sources"
"$PY" -m rig.cli "${ATTACH[@]}" --set run_root="$OUT/3" --scenario edge-96-block-boundary
echo "rc=$?"
