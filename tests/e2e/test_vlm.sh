#!/usr/bin/env bash
# The vision-language model. Its encoder against transformers: tests/e2e/siglip2_reference.py
# saves a tiny random Siglip2VisionModel folder and one forward (two images of different patch
# grids, padded); the unit test Siglip2.MatchesTransformers (in test_models beside the titan
# binary) loads the folder and reproduces the last hidden state and the attention-pooled output.
# Then training on the procedural shapes (the loss on captions falls; the trained model captions
# images it never saw with their shape and colours), FSDP 2, DDP 2, TP 2, HSDP 2x2 and FSDP 2 x
# TP 2 against one process, a resume, a folder dataset, and the refusals.
source "$(dirname "$0")/lib.sh"
python_and_tests test_models
expect_exit 0 "$PY" "$(dirname "$0")/siglip2_reference.py" "$WORK/siglip2"
TITAN_SIGLIP2_FIXTURE="$WORK/siglip2" expect_exit 0 "$TESTS" --gtest_filter='Siglip2.*'
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with transformers was skipped"
[ "$(grep -c "vs transformers Siglip2VisionModel" "$WORK/out")" = 2 ] ||
  fail "expected the hidden state and pooled output comparisons"
grep "vs transformers Siglip2VisionModel" "$WORK/out"
# The image preprocessing against TorchTitan's (its resize by patch count, Pillow, numpy).
expect_exit 0 "$PY" "$(dirname "$0")/vlm_image_reference.py" "$WORK/vlm_images"
TITAN_VLM_IMAGE_FIXTURE="$WORK/vlm_images" expect_exit 0 "$(dirname "$TITAN")/test_data" \
  --gtest_filter='ImageTextBatches.PreprocessingMatchesTorchTitan'
! grep -q "SKIPPED" "$WORK/out" || fail "the preprocessing comparison was skipped"
grep "vs TorchTitan's" "$WORK/out"
echo "PASS test_vlm (transformers reference)"

# The training runs choose their own threads (cores / local ranks): the references' two threads
# per process would oversubscribe the cores under `titan run`.
unset OMP_NUM_THREADS
cfg=(--job.config_file configs/vlm/debug_model.toml --metrics.log_freq 1 --metrics.peak_flops 1e12)
short=("${cfg[@]}" --training.mixed_precision_param float32 --training.steps 10
  --validation.freq 5 --validation.steps 1 --debug.seed 7 --checkpoint.enable true
  --checkpoint.interval 5 --checkpoint.last_save_model_only false)

# The debug run (the config as shipped: bf16 matmuls, 200 steps).
train_run long 1 "${cfg[@]}" --debug.seed 3 --checkpoint.enable true --checkpoint.interval 200
grep -q "loss on text tokens only" "$WORK/long.log" || fail "no image-text data line"
metric_values long loss | awk '
  NR <= 5 { first += $1 } { v[NR] = $1 }
  END { for (i = NR - 19; i <= NR; i++) last += v[i]; first /= 5; last /= 20
        printf "vlm debugmodel, 200 steps: caption loss %.4f (first 5 steps) -> %.4f (last 20)\n", first, last
        exit !(last < 0.1 * first) }' || fail "the vlm debug model's loss did not fall tenfold"
grep "validate step: 200" "$WORK/long.log"
grep "step: 200" "$WORK/long.log"

# Captions of two images drawn here (not from the dataset): the shape and both colours must be
# read from the pixels; the cached and uncached paths give the same greedy tokens.
expect_exit 0 "$PY" -c "
import sys
from PIL import Image, ImageDraw
red, green, blue = (220, 40, 40), (40, 170, 60), (40, 80, 220)
im = Image.new('RGB', (64, 64), blue); ImageDraw.Draw(im).rectangle([20, 20, 44, 44], fill=red)
im.save(sys.argv[1] + '/red_square.png')
im = Image.new('RGB', (64, 64), red); ImageDraw.Draw(im).ellipse([18, 18, 46, 46], fill=green)
im.save(sys.argv[1] + '/green_circle.png')" "$WORK"
caption() {  # caption IMAGE [FLAGS...]: the greedy caption on stdout
  "$TITAN" generate --checkpoint "$WORK/long/checkpoint" --image "$WORK/$1.png" --prompt "" \
    --temperature 0 --max_new_tokens 24 "${@:2}" 2>"$WORK/gen.err" || { cat "$WORK/gen.err" >&2; fail "generate $1"; }
}
a="$(caption red_square)"; b="$(caption green_circle)"
echo "caption of a red square on blue: $a"
echo "caption of a green circle on red: $b"
[[ "$a" == *"red square on a blue background"* ]] || fail "wrong caption for the red square: $a"
[[ "$b" == *"green circle on a red background"* ]] || fail "wrong caption for the green circle: $b"
grep -q "image .*green_circle.png as 4 x 4 patches" "$WORK/gen.err" || fail "no image line"
[ "$(caption red_square --no_kv_cache)" = "$a" ] || fail "the uncached path captions otherwise"

data_parallel_parity 14 "${short[@]}"
# Tensor parallelism: the decoder split as llama3's, the image merge on whole sequences, the
# encoder whole on both ranks.
train_run tp2 2 "${short[@]}" --training.local_batch_size 8 \
  --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 1
grep -q "tensor parallel over 2 ranks" "$WORK/tp2.log" || fail "no TP line"
same_as_one tp2
# Four ranks on two cores: HSDP (2 replicas of 2 shards) and FSDP 2 x TP 2.
train_run hsdp4 4 "${short[@]}" --training.local_batch_size 2 --validation.local_batch_size 2 \
  --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2
grep -q "HSDP: sharded over 2 ranks, replicated 2x" "$WORK/hsdp4.log" || fail "no HSDP line"
train_run fsdp2_tp2 4 "${short[@]}" --training.local_batch_size 4 --validation.local_batch_size 4 \
  --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 2
same_as_one hsdp4
same_as_one fsdp2_tp2

# A folder of images with a captions sidecar (the datasets users have): images of several sizes
# and aspects, one corrupt file, which stops the run naming it unless skipping is allowed.
expect_exit 0 "$PY" -c "
import json, os, sys
from PIL import Image
out = sys.argv[1]; os.makedirs(out)
rows = []
for i, (w, h) in enumerate([(80, 48), (64, 64), (30, 100), (200, 150), (17, 23)]):
    Image.new('RGB', (w, h), (40 * i, 200 - 30 * i, 90)).save(f'{out}/{i}.png')
    rows.append({'image': f'{i}.png', 'caption': f'a flat picture number {i}'})
open(f'{out}/broken.png', 'wb').write(b'\x89PNG\r\n\x1a\n' + b'\0' * 20)
rows.insert(2, {'image': 'broken.png', 'caption': 'never read'})
with open(f'{out}/captions.jsonl', 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rows)" "$WORK/folder"
folder=("${cfg[@]}" --training.dataset folder --training.dataset_path "$WORK/folder"
  --training.local_batch_size 2 --training.max_images_per_batch 2 --training.steps 4
  --validation.enable false --job.dump_folder "$WORK/folder_run")
expect_exit 1 "$TITAN" train "${folder[@]}"
grep -q "broken.png" "$WORK/out" || { cat "$WORK/out" >&2; fail "the corrupt image is not named"; }
expect_exit 0 "$TITAN" train "${folder[@]}" --training.skip_unreadable_images true
grep -q "skipping a row that does not read" "$WORK/out" || fail "no skip warning"
grep -q "step: 4" "$WORK/out" || fail "the folder run did not train 4 steps"
echo "folder dataset: 5 images of 5 sizes trained, the corrupt one named, then skipped when allowed"

# Refusals: settings that are not built are said, not ignored.
refused() {  # refused TEXT ARGS...
  local text="$1"; shift
  expect_exit 2 "$TITAN" train "${cfg[@]}" --training.steps 1 --job.dump_folder "$WORK/refused" "$@"
  grep -q -- "$text" "$WORK/out" || { cat "$WORK/out" >&2; fail "expected '$text'"; }
}
refused "only 0 (one sample per sequence)" --training.packing_buffer_size 100
refused "training.patch_size = 14 but the model's encoder cuts patches of 16" --training.patch_size 14
refused "only 1 is" --training.spatial_merge_size 2
refused "needs 40 positions" --training.seq_len 32 --validation.seq_len 32 \
  --training.max_patches_per_image 64 --training.img_size 96
expect_exit 2 "$TITAN" run --nproc_per_node 2 -- train "${cfg[@]}" --training.steps 1 \
  --parallelism.context_parallel_degree 2 --job.dump_folder "$WORK/cp"
grep -q "context parallelism of the vision-language model is not built yet" "$WORK/out" ||
  { cat "$WORK/out" >&2; fail "CP not refused with the reason"; }
expect_exit 2 "$TITAN" generate --model.name llama3 --flavor tiny --image "$WORK/red_square.png" --prompt ""
grep -q -- "--image needs a vision-language model" "$WORK/out" || fail "--image on a text model"
echo "PASS test_vlm (training, captions, FSDP/DDP/TP/HSDP/2D parity, resume, folder data, refusals)"
