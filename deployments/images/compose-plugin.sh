#!/usr/bin/env bash
# `make compose-plugin`: Compose v2 (`docker compose`) as a docker CLI plugin.
# When the machine has none (only docker-compose 1.x), build $COMPOSE_VERSION
# from the Go module proxy into ~/.docker/cli-plugins/docker-compose. v2.28.1
# is the newest the proxy holds that builds in-process (no bake, no buildx
# plugin needed) and talks to Engine API 1.41 (Docker 20.10).
set -euo pipefail
version=${COMPOSE_VERSION:-v2.28.1}
if docker compose version >/dev/null 2>&1; then
	echo ">> $(docker compose version)"
	exit 0
fi
command -v go >/dev/null || { echo "error: docker compose (v2) is missing and go is not installed to build it" >&2; exit 1; }
plugins=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
echo ">> docker compose is missing: building Compose $version from the Go module proxy into $plugins (a few minutes, once)"
dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/docker/compose/v2@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "error: go mod download github.com/docker/compose/v2@$version failed" >&2; exit 1; }
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp -r "$dir/." "$src" && chmod -R u+w "$src"
mkdir -p "$plugins"
(cd "$src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
	-ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$version" -o "$plugins/docker-compose.tmp" ./cmd)
mv "$plugins/docker-compose.tmp" "$plugins/docker-compose"
echo ">> $(docker compose version)"
