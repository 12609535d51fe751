#!/usr/bin/env bash
# A host's install of one extra, as README.md (Installing) tells an operator: a fresh venv
# outside the checkout, the extra's runtime lock with hashes, then the package itself without
# dependencies; then, from outside the checkout, `p4bs --version` and the part's commands'
# --help, `pip check`, and the venv's size (the figure README.md quotes). The venv is removed
# at the end (KEEP=1 keeps it).
#
#   tests/bench/install_extra.sh optimizer          # or base, jobs, ops, testbed, loop, eval, dev
#
# Downloads what pip's cache lacks (the optimizer's torch with its CUDA wheels: ~3 GB).
set -euo pipefail
extra=${1:?usage: $0 base|jobs|optimizer|ops|testbed|loop|eval|dev}
checkout=$(cd "$(dirname "$0")/../.." && pwd)
lock=$checkout/requirements/$extra.lock
[ -f "$lock" ] || { echo "no lock $lock" >&2; exit 2; }
venv=${VENV:-/tmp/p4bs-install-$extra}
case $venv/ in "$checkout"/*) echo "the venv must be outside the checkout" >&2; exit 2 ;; esac
rm -rf "$venv"

# Each extra's packages, every module of which must import on a host with it (p4bs_cli.main.PARTS).
base_packages="p4bs p4bs_schemas p4bs_linux_tc p4bs_cli p4bs_exporter p4bs_sinks"
declare -A packages=(
  [base]=""
  [jobs]="p4bs_jobs"
  [optimizer]="p4bs_optimizer"
  [ops]="p4bs_ops p4bs_optimizer"
  [testbed]="p4bs_infra"
  [loop]="p4bs_loop p4bs_infra p4bs_jobs p4bs_optimizer"
  [eval]="p4bs_eval p4bs_loop p4bs_infra p4bs_jobs p4bs_optimizer"
  [dev]="p4bs_jobs p4bs_optimizer p4bs_ops p4bs_infra p4bs_loop p4bs_eval"
)
# And its commands, whose --help must run there.
declare -A commands=(
  [base]="sinks influx;sinks alerts;exporter run;analyze"
  [jobs]="jobs run;jobs submit"
  [optimizer]="optimizer run;optimizer freeze"
  [ops]="status;dashboard;optimizer run"
  [testbed]="stack up;testbed up"
  [loop]="demo;chaos run"
  [eval]="eval run;eval report"
  [dev]="optimizer run;dashboard;demo;eval run"
)

began=$(date +%s)
python3.11 -m venv "$venv"
"$venv/bin/python" -m pip install -q --require-hashes -r "$lock"
# A local path has no hash: the package itself goes in a second call, without dependencies.
"$venv/bin/python" -m pip install -q --no-deps "$checkout"
installed=$(($(date +%s) - began))

cd /tmp
env -u PYTHONPATH -u P4BS_HOME "$venv/bin/p4bs" --version
IFS=';' read -ra wanted <<<"${commands[$extra]}"
for command in "${wanted[@]}"; do
  # shellcheck disable=SC2086  # the command's words
  env -u PYTHONPATH -u P4BS_HOME "$venv/bin/p4bs" $command --help >/dev/null
  echo "p4bs $command --help: ok"
done
# shellcheck disable=SC2086  # the package names
env -u PYTHONPATH -u P4BS_HOME "$venv/bin/python" -c '
import importlib, pkgutil, sys
count = 0
for package in sys.argv[1:]:
    top = importlib.import_module(package)
    count += 1
    for module in pkgutil.walk_packages(top.__path__, package + "."):
        if not module.name.endswith(".__main__"):
            importlib.import_module(module.name)
            count += 1
print(f"{count} modules of {len(sys.argv) - 1} packages import")
' $base_packages ${packages[$extra]}
"$venv/bin/python" -m pip check
size=$(du -sh "$venv" | cut -f1)
echo "[$extra] installed in ${installed} s: $size in $venv"
[ "${KEEP:-0}" = 1 ] || rm -rf "$venv"
