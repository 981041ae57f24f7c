#!/usr/bin/env bash
# Prints the path of a Helm binary built from its Go module, building it once into the
# cache (a few minutes on a 2-core machine; instant afterwards).
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
TOOLS="${DSEC_TOOLS_DIR:-$HOME/.cache/dsec/tools}"
BIN_DIR="$TOOLS/helm-$HELM_VERSION"
if [[ ! -x "$BIN_DIR/helm" ]]; then
    [[ -x "$GO" ]] || { echo "helm.sh: Go is needed to build Helm ($GO not found)" >&2; exit 1; }
    mkdir -p "$BIN_DIR"
    echo "building Helm $HELM_VERSION into $BIN_DIR" >&2
    GOBIN="$BIN_DIR.partial" CGO_ENABLED=0 "$GO" install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
    mv "$BIN_DIR.partial/helm" "$BIN_DIR/helm"
    rmdir "$BIN_DIR.partial"
fi
echo "$BIN_DIR/helm"
