#!/usr/bin/env bash
# Prints the path of a promtool binary (Prometheus's rule checker) built from its Go
# module, building it once into the cache (it compiles every service discovery Prometheus
# has: many minutes on a 2-core machine; instant afterwards).
set -euo pipefail
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"  # the Go module's version of Prometheus 3
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
TOOLS="${DSEC_TOOLS_DIR:-$HOME/.cache/dsec/tools}"
BIN_DIR="$TOOLS/promtool-$PROMETHEUS_VERSION"
if [[ ! -x "$BIN_DIR/promtool" ]]; then
    [[ -x "$GO" ]] || { echo "promtool.sh: Go is needed to build promtool ($GO not found)" >&2; exit 1; }
    mkdir -p "$BIN_DIR"
    echo "building promtool $PROMETHEUS_VERSION into $BIN_DIR" >&2
    GOBIN="$BIN_DIR.partial" CGO_ENABLED=0 "$GO" install \
        "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" >&2
    mv "$BIN_DIR.partial/promtool" "$BIN_DIR/promtool"
    rmdir "$BIN_DIR.partial"
fi
echo "$BIN_DIR/promtool"
