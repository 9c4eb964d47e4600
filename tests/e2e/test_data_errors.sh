# A corrupt or missing corpus is detected and reported (exit 1) before any training happens.
source "$(dirname "$0")/lib.sh"
cache="${TITAN_CACHE:-$HOME/.cache/titan}/datasets/sotu"
[ -d "$cache" ] || fail "corpus not found at $cache; run scripts/setup.sh"

args=(train --job.config_file configs/llama3/debug_model.toml --job.dump_folder "$WORK/run"
      --training.steps 2 --validation.enable=false)

expect_exit 1 "$TITAN" "${args[@]}" --training.dataset_path "$WORK/nowhere"
expect_output "nowhere"
expect_output "setup.sh"

cp -r "$cache" "$WORK/sotu"
victim=$(ls "$WORK/sotu" | grep '\.txt$' | sort | sed -n 1p)  # sed reads all: no SIGPIPE under pipefail
printf 'tampered' >> "$WORK/sotu/$victim"
expect_exit 1 "$TITAN" "${args[@]}" --training.dataset_path "$WORK/sotu"
expect_output "$victim"

expect_exit 2 "$TITAN" "${args[@]}" --training.dataset sotux
expect_output "sotu"
echo "ok"
