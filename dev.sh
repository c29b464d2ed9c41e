#!/usr/bin/env bash
# Set up (idempotent) and run Stalwart from a fresh clone.
#   ./dev.sh demo [args]   create .venv, install, run `stalwart demo`
#   ./dev.sh test [args]   create .venv, install with test extras, run the whole test suite
#   ./dev.sh fast [args]   the inner loop: unit and integration tests only (docs/testing.md)
#   ./dev.sh setup         only create/update .venv
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${STALWART_VENV:-.venv}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "dev.sh: creating the virtual environment $VENV ..." >&2
    "$PY" -m venv "$VENV"
  fi
  local stamp="$VENV/.stalwart-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    local t0=$SECONDS
    echo "dev.sh: [1/2] upgrading pip ..." >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    echo "dev.sh: [2/2] installing stalwart, torch and the test extras" \
      "(about 1.5 GB; 1-3 minutes the first time, pip prints nothing meanwhile) ..." >&2
    "$VENV/bin/python" -m pip install -q -e ".[dev]"
    touch "$stamp"
    echo "dev.sh: installed in $((SECONDS - t0)) s" >&2
  fi
}

# Most test time is spent waiting on real processes (rendezvous, timeouts, restarts), so one worker
# more than the cores keeps the CPUs busy (docs/testing.md has the measurements).
workers() {
  if [ -n "${STALWART_TEST_WORKERS:-}" ]; then echo "$STALWART_TEST_WORKERS"; return; fi
  echo $(( $(nproc 2>/dev/null || echo 1) + 1 ))
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; exec "$VENV/bin/stalwart" demo "$@" ;;
  # tests: test files run in parallel, one file per worker at a time (module set-ups are shared within
  # a file); STALWART_TEST_WORKERS=0 runs them in this process. --durations: where the time goes.
  test) setup; exec "$VENV/bin/python" -m pytest -q -ra --durations=30 -n "$(workers)" --dist loadfile "$@" ;;
  fast) setup; exec "$VENV/bin/python" -m pytest -q -ra --durations=15 -n "$(workers)" --dist loadfile \
          tests/unit tests/integration "$@" ;;
  *) echo "usage: ./dev.sh {demo|test|fast|setup} [args]" >&2; exit 2 ;;
esac
