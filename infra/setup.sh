#!/usr/bin/env bash
# make setup: one line per step, the tools' own output in .venv/logs/, and on a failure the
# name of what is missing and how to get it.
set -uo pipefail
PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-.venv}"
LOGS="$VENV/logs"

need() {  # need COMMAND WHAT HOW
    if ! command -v "$1" > /dev/null 2>&1; then
        echo "setup: $2 is missing ($1 not on PATH). $3" >&2
        exit 1
    fi
}

step() {  # step NAME LOG COMMAND...
    local name="$1" log="$2"
    shift 2
    printf 'setup: %-38s' "$name"
    local start=$SECONDS
    if "$@" > "$log" 2>&1; then
        echo "ok ($((SECONDS - start)) s)"
    else
        echo "FAILED"
        echo "--- last lines of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
}

case "${1:-}" in
python)
    need "$PYTHON" "Python 3.11" "Install it (Debian: apt-get install python3.11 python3.11-venv)."
    test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV" || {
        echo "setup: could not make $VENV (Debian: apt-get install python3.11-venv)" >&2
        exit 1
    }
    mkdir -p "$LOGS"
    step "pip, setuptools, wheel" "$LOGS/pip-tools.log" \
        "$VENV/bin/python" -m pip install --upgrade pip setuptools wheel
    step "dsec and its dependencies (torch…)" "$LOGS/pip-install.log" \
        "$VENV/bin/python" -m pip install -e '.[test]'
    ;;
kafka)
    need java "Java 17" "Install a JDK 17 (Debian: apt-get install openjdk-17-jdk-headless)."
    need mvn "Maven" "Install Maven (Debian: apt-get install maven); it fetches the broker's jars."
    mkdir -p "$LOGS"
    step "Kafka broker jars (Maven Central)" "$LOGS/kafka-jars.log" "$VENV/bin/dsec" kafka fetch
    ;;
native)
    need "${CC:-cc}" "a C compiler" "Install one (Debian: apt-get install gcc make)."
    mkdir -p "$LOGS"
    step "native probe library" "$LOGS/native.log" make -C ingest/native
    ;;
tools)
    need go "Go" "Install Go 1.22 or newer (https://go.dev/doc/install); it builds Helm, Compose and promtool."
    mkdir -p "$LOGS"
    step "Helm (built from its Go module)" "$LOGS/helm.log" bash infra/tools/helm.sh
    step "Docker Compose (Go module)" "$LOGS/compose.log" bash infra/tools/docker-compose.sh
    step "promtool (Prometheus's Go module)" "$LOGS/promtool.log" bash infra/tools/promtool.sh
    ;;
*)
    echo "usage: infra/setup.sh python|kafka|native|tools" >&2
    exit 2
    ;;
esac
