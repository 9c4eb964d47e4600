# `titan pipeline-schedule` prints a schedule's per-rank table and its bubble, writes and reads
# the table as CSV, and rejects bad schedule names and impossible shapes with exit 2.
source "$(dirname "$0")/lib.sh"

expect_exit 0 "$TITAN" pipeline-schedule --help
expect_output "usage: titan pipeline-schedule"

expect_exit 0 "$TITAN" pipeline-schedule --schedule 1f1b --pp 4 --microbatches 8
expect_output "^ +Rank 0 +Rank 1 +Rank 2 +Rank 3"
expect_output "^Step 00: 0F0 "
expect_output "bubble fraction 0\.2727"
expect_output "\(p-1\)/\(m\+p-1\) = 3/11"

expect_exit 0 "$TITAN" pipeline-schedule --schedule ZBVZeroBubble --pp 2 --microbatches 4 \
  --comms --dump-csv "$WORK/zbv.csv"
expect_output "rank 0: 0 3 \| rank 1: 1 2"
expect_output "SEND_F"
grep -q "0F0" "$WORK/zbv.csv" || fail "zbv.csv lacks 0F0"
expect_exit 0 "$TITAN" pipeline-schedule --csv "$WORK/zbv.csv"
expect_output "pp 2, 4 stages, 4 microbatches"

expect_exit 2 "$TITAN" pipeline-schedule --schedule Interleaved1FB --pp 2 --microbatches 4
expect_output "did you mean 'Interleaved1F1B'"

expect_exit 2 "$TITAN" pipeline-schedule --schedule 1F1B --pp 4 --microbatches 2
expect_output "2 microbatches < 4 stages"

printf '0F0,0X0\r\n' > "$WORK/bad.csv"
expect_exit 2 "$TITAN" pipeline-schedule --csv "$WORK/bad.csv"
expect_output "row 1 \(rank 0\), column 2"

# (issue 37) Sizes that cannot finish are refused up front, with the limit, before any output.
expect_exit 2 timeout 20 "$TITAN" pipeline-schedule --schedule GPipe --pp 100000 --microbatches 100000
expect_output "= 1e\+10 \(stage, microbatch\) pairs, above the 1048576 a schedule may hold"
! grep -q "^Step" "$WORK/out" || fail "a table was printed before the refusal"
expect_exit 2 timeout 20 "$TITAN" pipeline-schedule --schedule Interleaved1F1B --pp 4 \
  --microbatches 8 --stages-per-rank 1000000
expect_output "above the 1048576 a schedule may hold"
printf '0F9223372036854775807\n' > "$WORK/huge.csv"
expect_exit 2 timeout 20 "$TITAN" pipeline-schedule --csv "$WORK/huge.csv"
expect_output "stage or microbatch number is above 1048575"
# A table that deadlocks gets its own message, naming what each rank waits for.
printf '0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n' > "$WORK/dead.csv"
expect_exit 2 "$TITAN" pipeline-schedule --csv "$WORK/dead.csv"
expect_output "the pipeline schedule deadlocks"
expect_output "rank 1: 1F1 \(action 0 of its table\) waits for 0F1"
# A CSV dumped for one schedule, trained under another schedule key: the keys are named.
expect_exit 0 "$TITAN" pipeline-schedule --schedule 1F1B --pp 2 --microbatches 4 --dump-csv "$WORK/1f1b.csv"
expect_exit 2 "$TITAN" train --job.config_file configs/llama3/debug_model.toml \
  --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule_csv "$WORK/1f1b.csv" \
  --job.dump_folder "$WORK/csv_run"
expect_output "1f1b.csv runs 2 stages, but the config gives 4: parallelism.pipeline_parallel_schedule 'Interleaved1F1B'"
expect_output "HINT: set pipeline_parallel_schedule to the schedule the CSV was made for \(1F1B or GPipe"

echo "ok"
