#!/usr/bin/env bash
# Regenerates golden/ (see golden/README.md). Run from the repo root after `make`.
set -eu
cd "$(dirname "$0")/../.."
build/flux-sim --config default --grid 2x3 --txt-len 4 --steps 2 --precision fp64 --dump-compress 9 \
  --dump golden/default-fp64.h5
