#!/usr/bin/env bash
# Prints the path of a Docker Compose v2 binary built from its Go module, building it once
# into the cache. Compose's go.mod has exclude directives, which `go install pkg@version`
# refuses, so the module is downloaded and built in a scratch copy.
set -euo pipefail
COMPOSE_VERSION="${COMPOSE_VERSION:-v2.40.3}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
TOOLS="${DSEC_TOOLS_DIR:-$HOME/.cache/dsec/tools}"
BIN_DIR="$TOOLS/compose-$COMPOSE_VERSION"
if [[ ! -x "$BIN_DIR/docker-compose" ]]; then
    [[ -x "$GO" ]] || { echo "docker-compose.sh: Go is needed ($GO not found)" >&2; exit 1; }
    echo "building Docker Compose $COMPOSE_VERSION into $BIN_DIR" >&2
    module_dir="$(cd "${TMPDIR:-/tmp}" && "$GO" mod download -json \
        "github.com/docker/compose/v2@$COMPOSE_VERSION" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$module_dir" ]] || { echo "docker-compose.sh: download failed" >&2; exit 1; }
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    cp -r "$module_dir/." "$scratch/"
    chmod -R u+w "$scratch"
    mkdir -p "$BIN_DIR"
    (cd "$scratch" && CGO_ENABLED=0 "$GO" build -trimpath \
        -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
        -o "$BIN_DIR/docker-compose.partial" ./cmd) >&2
    mv "$BIN_DIR/docker-compose.partial" "$BIN_DIR/docker-compose"
fi
echo "$BIN_DIR/docker-compose"
