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

echo "ok"
