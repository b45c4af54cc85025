#!/usr/bin/env bash
# `make images`: the base images of deployments/Dockerfile, built from what a
# machine without a container registry can reach (Debian's archive, the Go
# module proxy), then every image of docker-compose.yml from that Dockerfile
# with those bases as build arguments. Users with a registry need none of
# this: `docker compose up -d --build` builds on the public images the
# Dockerfile's ARGs name. docs/operations.md, "Run it with compose".
#
# Cached and re-runnable: each step says what it does and is skipped when its
# result exists (the Debian root file systems are tarred under $CACHE; the
# images are tagged with a hash of what went into them). It writes .env, so
# that `docker compose` uses these bases; delete .env to use the public ones.
#
#   MLSCHED_IMAGE_CACHE  cache directory (default ~/.cache/mlsched-images)
#   DEBIAN_MIRROR        Debian archive (default http://deb.debian.org/debian)
#   MLSCHED_COMPOSE      compose command for the final build (default: docker compose)
#   MLSCHED_IMAGES_NO_COMPOSE_BUILD=1  only the bases and .env
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
cache=${MLSCHED_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlsched-images}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
# What goes into the two Debian bases; changing a list makes new tags.
base_pkgs="ca-certificates,python3"
servers_pkgs="redis-server redis-sentinel redis-tools python3-sklearn prometheus"
t0=$SECONDS
say() { printf '>> [images %3ds] %s\n' $((SECONDS - t0)) "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }
hash8() { printf '%s' "$*" | sha256sum | cut -c1-8; }

command -v docker >/dev/null || die "docker is not installed"
docker info >/dev/null 2>&1 || die "no Docker daemon reachable (docker info failed)"
mkdir -p "$cache"

base_tag=mlsched-base/debian:$suite-$(hash8 "$suite $base_pkgs")
servers_tag=mlsched-base/debian-servers:$suite-$(hash8 "$suite $base_pkgs $servers_pkgs")
static_tag=mlsched-base/static:$(hash8 "$suite $base_pkgs static 65532")

need_root() {
	[ "$(id -u)" = 0 ] || die "building the Debian base needs root (debootstrap, chroot): run 'sudo make images' once"
	if ! command -v debootstrap >/dev/null; then
		say "installing debootstrap with apt-get"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap </dev/null
	fi
}

# 1. The Debian base: debootstrap (minbase) into $cache/rootfs-base.
base_tar=$cache/${base_tag##*:}-base.tar
if ! have_image "$base_tag"; then
	if [ ! -s "$base_tar" ]; then
		need_root
		rm -rf "$cache/rootfs-base"
		say "debootstrap $suite (minbase + $base_pkgs) from $mirror into $cache/rootfs-base (a few minutes)"
		debootstrap --variant=minbase --include="$base_pkgs" "$suite" "$cache/rootfs-base" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
			{ tail -20 "$cache/debootstrap.log" >&2; die "debootstrap failed (log: $cache/debootstrap.log)"; }
		rm -rf "$cache/rootfs-base"/var/cache/apt/archives/*.deb "$cache/rootfs-base"/var/lib/apt/lists/*
		tar -C "$cache/rootfs-base" -cf "$base_tar.tmp" . && mv "$base_tar.tmp" "$base_tar"
	fi
	say "docker import $base_tag"
	docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["/bin/bash"]' \
		"$base_tar" "$base_tag" >/dev/null
else
	say "$base_tag exists"
fi

# 2. The servers' base: the same plus Redis, Sentinel, scikit-learn and
# Prometheus from Debian, installed with apt-get in a chroot of a copy.
servers_tar=$cache/${servers_tag##*:}-servers.tar
if ! have_image "$servers_tag"; then
	if [ ! -s "$servers_tar" ]; then
		need_root
		[ -d "$cache/rootfs-base" ] || { mkdir -p "$cache/rootfs-base" && tar -C "$cache/rootfs-base" -xf "$base_tar"; }
		r=$cache/rootfs-servers
		rm -rf "$r" && cp -a "$cache/rootfs-base" "$r"
		cp /etc/resolv.conf "$r/etc/resolv.conf"
		printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d" && chmod +x "$r/usr/sbin/policy-rc.d"
		mount -t proc proc "$r/proc"
		trap 'umount "$r/proc" 2>/dev/null || true' EXIT
		say "apt-get install $servers_pkgs in a chroot of $r (a few minutes)"
		chroot "$r" env DEBIAN_FRONTEND=noninteractive sh -c \
			"apt-get update -qq && apt-get install -y -qq --no-install-recommends $servers_pkgs </dev/null" >"$cache/servers-apt.log" 2>&1 ||
			{ tail -20 "$cache/servers-apt.log" >&2; die "apt-get install in the chroot failed (log: $cache/servers-apt.log)"; }
		umount "$r/proc"; trap - EXIT
		rm -f "$r/usr/sbin/policy-rc.d" "$r/etc/resolv.conf"
		rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/*
		tar -C "$r" -cf "$servers_tar.tmp" . && mv "$servers_tar.tmp" "$servers_tar"
	fi
	say "docker import $servers_tag"
	docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["/bin/bash"]' \
		"$servers_tar" "$servers_tag" >/dev/null
else
	say "$servers_tag exists"
fi

# 3. The static base, for binaries that need nothing but CA certificates and
# a non-root user (distroless/static's nonroot, uid 65532).
if ! have_image "$static_tag"; then
	s=$cache/static
	rm -rf "$s" && mkdir -p "$s/etc/ssl/certs" "$s/tmp" "$s/home/nonroot"
	chmod 1777 "$s/tmp"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$s/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$s/etc/group"
	tar -xOf "$base_tar" ./etc/ssl/certs/ca-certificates.crt >"$s/etc/ssl/certs/ca-certificates.crt"
	chown 65532:65532 "$s/home/nonroot"
	say "docker import $static_tag (CA certificates, user nonroot)"
	tar -C "$s" -c . | docker import -c 'USER 65532:65532' -c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' - "$static_tag" >/dev/null
else
	say "$static_tag exists"
fi

# 4. Static Go binaries, built here (the host's build cache makes a rebuild
# take seconds): dispatcher, worker, mlsched, and nats-server at the version
# e2e/go.mod pins. They become the Dockerfile's build stage.
go=${GO:-go}
command -v "$go" >/dev/null || die "go is not installed"
out=$cache/binaries/out
mkdir -p "$out"
say "go build (static) dispatcher, mlsched, worker, nats-server $(cd e2e && "$go" list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)"
version=$(git describe --tags --always --dirty 2>/dev/null || echo devel)
CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w -X main.version=$version" -o "$out/" \
	./dispatcher/cmd/dispatcher ./dispatcher/cmd/mlsched ./worker/cmd/worker
(cd e2e && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w" -o "$out/nats-server" github.com/nats-io/nats-server/v2)
# The compose CLI for the autoscale profile's image (mlsched autoscale
# scales compose services with it): the plugin docker uses here, a static
# Go binary (make compose-plugin builds one); without it the Dockerfile
# builds Compose from the Go module proxy.
rm -f "$out/docker-compose"
plugin=$(docker info --format '{{range .ClientInfo.Plugins}}{{if eq .Name "compose"}}{{.Path}}{{end}}{{end}}' 2>/dev/null || true)
if [ -n "$plugin" ] && [ -x "$plugin" ]; then cp "$plugin" "$out/docker-compose"; fi
touch "$out/.prebuilt"
bins_tag=mlsched-base/binaries:$(cd "$out" && sha256sum dispatcher mlsched worker nats-server $(ls docker-compose 2>/dev/null) | sha256sum | cut -c1-12)
if ! have_image "$bins_tag"; then
	say "image $bins_tag: the binaries on $base_tag"
	printf 'FROM %s\nCOPY out/ /out/\n' "$base_tag" | DOCKER_BUILDKIT=0 docker build -q -t "$bins_tag" -f - "$cache/binaries" >/dev/null 2>"$cache/binaries.log" ||
		{ cat "$cache/binaries.log" >&2; die "docker build of $bins_tag failed"; }
else
	say "$bins_tag exists"
fi

# 5. .env: compose's variables, so that the compose file builds on the bases.
if [ -f .env ] && ! grep -q '^# written by make images' .env; then
	die ".env exists and was not written by make images: add these lines to it yourself:
MLSCHED_BUILD_IMAGE=$bins_tag
MLSCHED_BASE_IMAGE=$base_tag
MLSCHED_SERVERS_IMAGE=$servers_tag
MLSCHED_STATIC_IMAGE=$static_tag"
fi
cat >.env <<ENV
# written by make images (deployments/images/build.sh): docker compose builds
# on these local base images. Delete this file to build on public images.
MLSCHED_BUILD_IMAGE=$bins_tag
MLSCHED_BASE_IMAGE=$base_tag
MLSCHED_SERVERS_IMAGE=$servers_tag
MLSCHED_STATIC_IMAGE=$static_tag
ENV
say "wrote .env"

# 6. Every image of the compose file (every profile), from deployments/Dockerfile.
if [ "${MLSCHED_IMAGES_NO_COMPOSE_BUILD:-}" != 1 ]; then
	compose=${MLSCHED_COMPOSE:-docker compose}
	say "$compose build (every profile)"
	$compose -f docker-compose.yml --profile '*' build
fi
say "done"
