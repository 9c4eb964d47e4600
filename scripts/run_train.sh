#!/usr/bin/env bash
# Trains a model, TorchTitan-style:
#   CONFIG_FILE=./configs/llama3/debug_model.toml ./scripts/run_train.sh --training.steps 100
# NGPU is the number of ranks (1 for now; data parallelism arrives with the distributed runtime).
# Extra arguments are config overrides (--section.key value).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG_FILE="${CONFIG_FILE:-$root/configs/llama3/debug_model.toml}"
NGPU="${NGPU:-1}"
TITAN="${TITAN:-$root/build/titan}"

if [ "$NGPU" != "1" ]; then
  echo "run_train.sh: NGPU=$NGPU, but this build trains on one rank only (NGPU=1)" >&2
  exit 2
fi
if [ ! -x "$TITAN" ]; then
  echo "run_train.sh: $TITAN not found; run scripts/setup.sh first" >&2
  exit 2
fi
exec "$TITAN" train --job.config_file "$CONFIG_FILE" "$@"
