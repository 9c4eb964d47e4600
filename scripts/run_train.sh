#!/usr/bin/env bash
# Trains a model, TorchTitan-style:
#   CONFIG_FILE=./configs/llama3/debug_model.toml ./scripts/run_train.sh --training.steps 100
# NGPU is the number of local ranks: 1 runs `titan train` directly, N > 1 runs
# `titan run --nproc_per_node N -- train ...` (LOG_RANK picks the ranks that print, default 0).
# Extra arguments are config overrides (--section.key value).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG_FILE="${CONFIG_FILE:-$root/configs/llama3/debug_model.toml}"
NGPU="${NGPU:-1}"
TITAN="${TITAN:-$root/build/titan}"

if ! [[ "$NGPU" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_train.sh: NGPU='$NGPU' is not a positive number of ranks" >&2
  exit 2
fi
if [ ! -x "$TITAN" ]; then
  echo "run_train.sh: $TITAN not found; run scripts/setup.sh first" >&2
  exit 2
fi
if [ "$NGPU" = "1" ]; then
  exec "$TITAN" train --job.config_file "$CONFIG_FILE" "$@"
fi
exec "$TITAN" run --nproc_per_node "$NGPU" -- train --job.config_file "$CONFIG_FILE" "$@"
