#!/usr/bin/env bash
# Builds the local base image `superinfer-base:bookworm` from a debootstrap root file system,
# for machines without an image registry. Needs root, debootstrap and a running dockerd.
set -euo pipefail
tag=${1:-superinfer-base:bookworm}
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag already exists"
  exit 0
fi
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" http://deb.debian.org/debian
tar -C "$rootfs" -c . | docker import - "$tag"
echo "built $tag"
