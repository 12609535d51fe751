#!/bin/bash
# Runs (or goes on with) the fourth round of issue 39, the four *-r4 registrations of this
# folder, in its order: suite 1 but dyn-n-step, fig14-again, steady-fig11, suite 2, and
# last dyn-n-step, which the policy was changed after (`tuned_on` in dyn-suite-1-r4.toml).
# It is round-r3.sh (git history, up to 645caf9) with the -r4 names and that order. Each
# scenario's runs go to RUN_ROOT/<scenario> (raw, ~10 MB a run) and, after each run, what
# is worth committing to KEPT/<scenario>-r4 (`p4bs eval keep`); a scenario found in KEPT
# but not in RUN_ROOT, as on a new machine, is resumed from KEPT's scenario.json and
# results.jsonl. Each scenario is checked against its registration before its first run
# (`--registration`): a checkout whose rows it would refuse runs nothing. Once all of a scenario's runs are done, before
# anyone reads its rows, the simulator's predictions are made from its fixed buffers' runs
# (`surfaces`, then `offline`: KEPT/<scenario>-r4/surfaces-offline.{md,json}) and the change
# detectors scored on its windows (`detection`), all into the kept folder.
#
#   eval/registrations/round-r4.sh RUN_ROOT [KEPT]     (KEPT: default eval/results)
#
# From the root of a checkout at or after the registrations' commit with their policy tree,
# after `make setup`, as root (the testbed's namespaces), with P4BS_ROUTER_USER and
# P4BS_ROUTER_PASSWORD set (any pair: the testbed's router takes what it is given).
# Commit KEPT's new files as they come. Stop it with SIGTERM (the run in progress unwinds).
set -u
root=${1:?usage: $0 RUN_ROOT [KEPT]}
kept=${2:-eval/results}
here=eval/registrations
all=loss-delay-fit,p4bs,bdp,stanford,red,codel,fixed:4ms,fixed:15ms,fixed:50ms,fixed:200ms
stopped=0 child=
trap 'stopped=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT

scenario() {  # registration scenario offline-policies|- [p4bs eval run options...]
  local registration=$here/$1.json name=$2 offline=$3; shift 3
  local out=$root/$name keep=$kept/$name-r4
  [ "$stopped" = 1 ] && return
  if [ ! -f "$out/scenario.json" ] && [ -f "$keep/results.jsonl" ]; then
    mkdir -p "$out" && cp "$keep/scenario.json" "$keep/results.jsonl" "$out/"
  fi
  local where=(--out "$out")
  [ -f "$out/scenario.json" ] && where=(--resume "$out")
  .venv/bin/p4bs eval run "$name" "${where[@]}" --registration "$registration" \
    --keep-into "$keep" "$@" &
  child=$!
  wait "$child"
  local done=$?
  wait "$child" 2>/dev/null  # after a signal, until the run in progress has unwound
  child=
  echo "round-r4: $name ended $(date -u +%FT%TZ), exit $done"
  [ "$done" = 0 ] && [ "$stopped" = 0 ] && [ ! -f "$keep/detection.json" ] && analyse "$keep" "$offline"
}

analyse() {  # kept-folder offline-policies|-
  local keep=$1 offline=$2
  if [ "$offline" != - ] &&
    .venv/bin/p4bs eval surfaces "$keep" --out "$keep/surfaces.json.gz"; then
    .venv/bin/p4bs eval offline "$keep/surfaces.json.gz" --policies "$offline" --seeds 10
  fi
  .venv/bin/p4bs eval detection "$keep"
}

simulated=loss-delay-fit,p4bs,bdp,stanford  # the simulator's policies (no AQM in it)
for name in dyn-bbr-join dyn-rtt-move dyn-pause dyn-change-detect; do
  scenario dyn-suite-1-r4 "$name" $simulated
done
# No fixed buffers in Fig. 14: nothing to simulate on.
scenario fig14-again-r4 p4bs-fig14 - --repeat 10 \
  --policies bloated,bdp,stanford,adt,p4bs,loss-delay-fit,red,codel
scenario steady-fig11-r4 steady-fig11-loss100 loss-delay-fit
for name in dyn-burst dyn-p4bs-fig15 dyn-p4bs-fig16; do
  scenario dyn-suite-2-r4 "$name" $simulated
done
scenario dyn-suite-2-r4 globecom-test2 $simulated --repeat 10 --policies $all
scenario dyn-suite-2-r4 globecom-test3 $simulated --repeat 10 --policies $all
scenario dyn-suite-1-r4 dyn-n-step $simulated
