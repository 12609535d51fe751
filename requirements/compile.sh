#!/usr/bin/env bash
# Writes the locks of this folder from pyproject.toml (`make locks`; README.md, Installing).
# dev.lock: every extra and the development tools, what `make setup` installs. One runtime
# lock per extra (base.lock: the base install alone), each at dev.lock's versions. Every
# lock pins every package with its hashes, for `pip install --require-hashes`.
# A version already in dev.lock is kept (uv reads the file it rewrites): a new requirement
# gets the newest version that fits; `UPGRADE=package` moves one package on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${UV:?run it as make locks (the Makefile installs uv and names it)}"
compile() {
  "$UV" pip compile pyproject.toml --quiet --python python3.11 \
    --generate-hashes --custom-compile-command "make locks" "$@"
}
compile --all-extras ${UPGRADE:+--upgrade-package "$UPGRADE"} -o requirements/dev.lock
compile -c requirements/dev.lock -o requirements/base.lock
for extra in jobs optimizer ops testbed loop eval; do
  compile --extra "$extra" -c requirements/dev.lock -o "requirements/$extra.lock"
done
