# `titan data prepare` turns a text corpus (.txt + .jsonl) into token shards, `titan train` trains
# on those shards and on JSON lines directly, and bad data stops the run with file and line.
source "$(dirname "$0")/lib.sh"

corpus="$WORK/corpus"
mkdir -p "$corpus/nested"
for i in $(seq 1 12); do
  printf 'Document %d. %s\n' "$i" "$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 $i))" \
    > "$corpus/nested/doc_$i.txt"
done
for i in $(seq 1 40); do
  printf '{"text": "JSON line %d says hello to the data loader.", "id": %d}\n' "$i" "$i"
done > "$corpus/lines.jsonl"

expect_exit 0 "$TITAN" data prepare --input "$corpus" --output "$WORK/tokens" --shard-tokens 1500
expect_output "data prepare: done: 52 documents, [0-9,]+ tokens \(vocab 258\) in [0-9]+ shard"
expect_output "tokens/s"
shards=$(ls "$WORK/tokens" | grep -c '^shard_[0-9]*\.bin$')
[ "$shards" -ge 2 ] || fail "expected several shards, got $shards"

train=(train --job.config_file configs/llama3/debug_model.toml --training.steps 3
       --training.seq_len 64 --training.local_batch_size 2 --metrics.log_freq 1
       --metrics.peak_flops 1e12 --metrics.disable_color_printing)

# Shards of the byte tokenizer do not fit the config's tokenizer (sotu_2k, vocab 2048) ...
expect_exit 1 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_tokens" \
  --training.dataset tokens --training.dataset_path "$WORK/tokens" --validation.enable=false
expect_output "written by a tokenizer with vocab 258, but training uses one with vocab 2048"
# ... so they train with the byte tokenizer, and shards of the config's tokenizer with the config.
expect_exit 0 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_tokens" \
  --training.dataset tokens --training.dataset_path "$WORK/tokens" --validation.enable=false \
  --model.hf_assets_path ""
expect_output "dataset tokens: 52 documents, shuffled each epoch; tokenizer vocab 258"
expect_output "step: 3 .*loss: "
expect_exit 0 "$TITAN" data prepare --input "$corpus" --output "$WORK/tokens_2k" \
  --tokenizer assets/tokenizer/sotu_2k
expect_output "data prepare: done: 52 documents, [0-9,]+ tokens \(vocab 2048\)"
expect_exit 0 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_tokens_2k" \
  --training.dataset tokens --training.dataset_path "$WORK/tokens_2k" --validation.enable=false
expect_output "tokenizer vocab 2048"
expect_output "step: 3 .*loss: "

# JSON lines with another text field, read directly; validation on a text file in fixed order.
sed 's/"text"/"body"/' "$corpus/lines.jsonl" > "$WORK/body.jsonl"
expect_exit 0 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_jsonl" \
  --training.dataset auto --training.dataset_path "$WORK/body.jsonl" \
  --training.dataset_text_field body --validation.enable=true --validation.freq 3 \
  --validation.dataset text --validation.dataset_path "$corpus/nested" \
  --validation.seq_len 64 --validation.local_batch_size 2
expect_output "dataset auto: 40 documents"
expect_output "validation dataset text: 12 documents"
expect_output "validation_loss: "

# Bad input: each a clear error naming the file (and line or byte offset).
expect_exit 1 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_bad" \
  --training.dataset jsonl --training.dataset_path "$WORK/body.jsonl" --validation.enable=false
expect_output "body.jsonl:1: no \"text\" field"

printf '{"text": "ok"}\n{"text": "unterminated\n' > "$WORK/broken.jsonl"
expect_exit 1 "$TITAN" data prepare --input "$WORK/broken.jsonl" --output "$WORK/tokens2"
expect_output "broken.jsonl:2: malformed JSON"

truncate -s -5 "$WORK/tokens/shard_00001.bin"
expect_exit 1 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_trunc" \
  --training.dataset tokens --training.dataset_path "$WORK/tokens" --validation.enable=false
expect_output "shard_00001.bin: truncated"

: > "$WORK/empty.txt"
expect_exit 1 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_empty" \
  --training.dataset text --training.dataset_path "$WORK/empty.txt" --validation.enable=false
expect_output "empty.txt: empty file"

expect_exit 1 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_missing" \
  --training.dataset text --training.dataset_path "$WORK/nowhere" --validation.enable=false
expect_output "nowhere' does not exist"

expect_exit 2 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_name" --training.dataset tokns
expect_output "did you mean 'tokens'"
expect_exit 2 "$TITAN" "${train[@]}" --job.dump_folder "$WORK/run_nopath" --training.dataset jsonl
expect_output "dataset_path"

expect_exit 2 "$TITAN" data prepare --output "$WORK/x"
expect_output "no --input"
expect_exit 2 "$TITAN" data prepare --input "$corpus" --output "$WORK/x" --shard-tokens lots
expect_output "--shard-tokens expects an integer"
expect_exit 2 "$TITAN" data shuffle
expect_output "unknown action 'shuffle'"
expect_exit 0 "$TITAN" data --help
expect_output "TITANTOK"
echo "ok"
