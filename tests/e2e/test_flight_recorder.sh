# The flight recorder end to end: a rank that hangs between two collectives (selftest), and a
# training rank frozen with SIGSTOP, each make the job end within comm.train_timeout_seconds;
# the surviving rank dumps its buffer (on the timeout), the hung one too (SIGUSR1 from `titan
# run`), and `titan fr analyze` names the rank that lags and the collective it never issued.
# Ranks that fail together may get the launcher's SIGUSR1 while already exiting: they still write
# a real dump, and never write into the current directory. Every command runs under `timeout 60`.
source "$(dirname "$0")/lib.sh"

# --- selftest: rank 1 hangs after the all_reduce, rank 0 times out in the all_gather ---
start=$(date +%s)
expect_exit 1 timeout 60 "$TITAN" run --nproc_per_node 2 -- selftest --fail_rank 1 \
  --fail_mode hang --fail_at collective --comm.train_timeout_seconds 3 \
  --job.dump_folder "$WORK/st"
elapsed=$(($(date +%s) - start))
[ "$elapsed" -lt 30 ] || fail "the hung selftest took ${elapsed}s to end"
expect_output 'all_gather_into_tensor #1 on process group .world.* failed after'
for r in 0 1; do
  [ -s "$WORK/st/comm_traces/rank_$r.json" ] || { cat "$WORK/out" >&2; fail "no dump of rank $r"; }
done
expect_exit 1 "$TITAN" fr analyze "$WORK/st/comm_traces"
expect_output 'all_gather_into_tensor #1 \(Long, numel 1\) was issued by ranks \[0\] but not by ranks \[1\]'
expect_output 'rank 1 last issued all_reduce #0 \(Float, numel 4\), completed'
expect_output 'lagging ranks: \[1\]'
echo "selftest hang: job down in ${elapsed}s, analyzer names rank 1 and all_gather_into_tensor #1"

# --- three ranks fail their config check at once, five times, from an empty directory ---
# (Once, the dump thread of a rank in exit() read its recorder after static destruction and made
# directories named with freed bytes here: 3 runs out of 3 did before the fix.)
mkdir -p "$WORK/cwd"
titan_abs=$(realpath "$TITAN"); root=$PWD
for i in 1 2 3 4 5; do
  (cd "$WORK/cwd" && expect_exit 2 timeout 60 "$titan_abs" run --nproc_per_node 3 -- train \
    --job.config_file "$root/configs/llama3/debug_model.toml" --model.hf_assets_path ./missing \
    --job.dump_folder "$WORK/fail$i")
  expect_output "model.hf_assets_path: './missing' does not exist"
  [ -z "$(ls -A "$WORK/cwd")" ] ||
    fail "failing ranks wrote into the current directory: $(ls -Ab "$WORK/cwd" | tr '\n' ' ')"
  if [ -d "$WORK/fail$i/comm_traces" ]; then  # the dumps the launcher asked for are whole
    set +e; "$TITAN" fr analyze "$WORK/fail$i/comm_traces" >"$WORK/out" 2>&1; code=$?; set -e
    [ "$code" -le 1 ] || { cat "$WORK/out" >&2; fail "run $i left an unreadable dump"; }
  fi
done
echo "ranks failing together: nothing written to the current directory (5 runs)"

# The analyzer on agreeing dumps (rank 0's first entry alone on both sides) and on bad input.
mkdir -p "$WORK/bad"
echo '{"rank": 0, "entries": [' >"$WORK/bad/rank_0.json"
expect_exit 2 "$TITAN" fr analyze "$WORK/bad"
expect_output 'rank_0.json: not a readable flight-recorder dump'
expect_exit 2 "$TITAN" fr analyze "$WORK/nowhere"

# --- training: rank 1 frozen by SIGSTOP after a few steps; comm.train_timeout_seconds 3 ---
"$TITAN" run --nproc_per_node 2 -- train --job.config_file configs/llama3/debug_model.toml \
  --model.hf_assets_path "" --training.steps 100000 --training.seq_len 32 \
  --training.local_batch_size 2 --training.global_batch_size 4 \
  --metrics.log_freq 1 --checkpoint.enable false --validation.enable false \
  --comm.init_timeout_seconds 60 --comm.train_timeout_seconds 3 \
  --job.dump_folder "$WORK/train" >"$WORK/out" 2>&1 &
launcher=$!
start_watchdog 60 "$launcher"
for _ in $(seq 300); do
  grep -qE 'step: +3 ' "$WORK/out" && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
grep -qE 'step: +3 ' "$WORK/out" || { cat "$WORK/out" >&2; fail "training did not reach step 3"; }
rank1=""
for pid in $(pgrep -P "$launcher"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'RANK=1'; then rank1=$pid; fi
done
[ -n "$rank1" ] || fail "cannot find rank 1's process"
kill -STOP "$rank1"
start=$(date +%s)
set +e; wait "$launcher"; code=$?; set -e
elapsed=$(($(date +%s) - start))
stop_watchdog
[ "$code" != 0 ] || { cat "$WORK/out" >&2; fail "the job with a stopped rank exited 0"; }
[ "$elapsed" -lt 20 ] || fail "the job with a stopped rank took ${elapsed}s to end"
[ -s "$WORK/train/comm_traces/rank_0.json" ] || { cat "$WORK/out" >&2; fail "no dump of rank 0"; }
expect_exit 1 "$TITAN" fr analyze "$WORK/train/comm_traces"
# Rank 1 was frozen before it issued the collective rank 0 waits for, or inside it: it lags, or
# never completed it; a frozen rank may leave no dump at all.
grep -qE 'lagging ranks: \[1\]|not completed on ranks \[(0, )?1\]' "$WORK/out" ||
  { cat "$WORK/out" >&2; fail "the analyzer does not name rank 1"; }
grep -oE '(all_reduce|all_gather_into_tensor|reduce_scatter_tensor|all_to_all_single|broadcast|barrier) #[0-9]+' \
  "$WORK/out" | head -n 1 | grep -q . || { cat "$WORK/out" >&2; fail "no collective named"; }
echo "training, rank 1 stopped: job down in ${elapsed}s; $(grep -m1 -E 'was issued|not completed' "$WORK/out")"
