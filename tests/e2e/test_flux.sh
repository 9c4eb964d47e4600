#!/usr/bin/env bash
# FLUX.1 (models/flux) against the pinned diffusers: tests/e2e/flux_reference.py saves tiny random
# FluxTransformer2DModel folders (with and without the guidance embedding) and one forward's
# inputs and output; the unit test FluxDiffusers.MatchesDiffusers (in test_models beside the
# titan binary) loads each folder through our diffusers adapter, reproduces the output and
# writes the tensors back under diffusers' names bit for bit; FluxDiffusers.AutoencoderMatchesDiffusers
# does the same for a tiny AutoencoderKL of FLUX.1's layout (encoder moments, the transformer's
# scaled and shifted latents, decoding); TextEncoders.* the T5 and CLIP text encoders against
# transformers' T5EncoderModel and CLIPTextModel (CLIP with both end-of-text rules).
source "$(dirname "$0")/lib.sh"
python_and_tests test_models
expect_exit 0 "$PY" "$(dirname "$0")/flux_reference.py" "$WORK/flux"
TITAN_FLUX_FIXTURE="$WORK/flux" expect_exit 0 "$TESTS" --gtest_filter='FluxDiffusers.*:TextEncoders.*'
! grep -q "SKIPPED" "$WORK/out" || fail "the comparison with diffusers was skipped"
grep "vs diffusers FluxTransformer2DModel" "$WORK/out"
[ "$(grep -c "vs diffusers FluxTransformer2DModel" "$WORK/out")" = 2 ] ||
  fail "expected the schnell and dev comparisons"
[ "$(grep -c "vs diffusers AutoencoderKL" "$WORK/out")" = 3 ] ||
  fail "expected the autoencoder's three comparisons"
grep -q "t5 encoder vs transformers T5EncoderModel" "$WORK/out" || fail "no T5 comparison"
[ "$(grep -c "vs transformers CLIPTextModel" "$WORK/out")" = 4 ] ||
  fail "expected CLIP's hidden states and pooled outputs under both end-of-text rules"

# titan convert: a diffusers FluxTransformer2DModel folder to a titan checkpoint and back; diffusers
# loads the result, whose tensors are the original's bit for bit, and reproduces the output.
expect_exit 0 "$TITAN" convert from-hf "$WORK/flux/dev" "$WORK/flux_ckpt"
expect_exit 0 "$TITAN" convert to-hf "$WORK/flux_ckpt" "$WORK/flux_back"
expect_exit 0 "$PY" -c "
import sys, torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import load_file
src, back = sys.argv[1], sys.argv[2]
a = load_file(src + '/diffusion_pytorch_model.safetensors')
b = load_file(back + '/diffusion_pytorch_model.safetensors')
assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), 'tensors differ'
m = FluxTransformer2DModel.from_pretrained(back).eval()
io = load_file(src + '/io.safetensors')
want = io.pop('sample')
with torch.no_grad():
    err = (m(**io, return_dict=False)[0] - want).abs().max().item()
assert err < 1e-4, err
print(f'diffusers -> titan -> diffusers: {len(a)} tensors bit for bit, output within {err:.1e}')
" "$WORK/flux/dev" "$WORK/flux_back"
cat "$WORK/out" | grep "bit for bit"
echo "PASS test_flux (diffusers and transformers references)"

# Training (flow matching on the procedural shapes, training.test_mode: random encoders): the
# debug model's loss falls; FSDP 2, DDP 2, TP 2, FSDP 2 x TP 2 and HSDP 2 x 2 reproduce the
# one-process run (losses, validation losses, final parameters); resumed runs reproduce the steps
# after their checkpoint, across layouts; refusals.
# The training runs choose their own threads (cores / local ranks): the references' two threads
# per process would oversubscribe the cores under `titan run`.
unset OMP_NUM_THREADS
cfg=(--job.config_file configs/flux/debug_model.toml --training.mixed_precision_param float32
  --metrics.log_freq 1 --metrics.peak_flops 1e12)
short=("${cfg[@]}" --training.steps 10 --validation.freq 5 --validation.steps 1 --debug.seed 7
  --training.global_batch_size 8 --checkpoint.enable true --checkpoint.interval 5
  --checkpoint.last_save_model_only false)

train_run long 1 "${cfg[@]}" --training.steps 300 --validation.freq 100 --debug.seed 3 \
  --checkpoint.enable true --checkpoint.interval 300
grep -q "flow matching: autoencoder ch 32" "$WORK/long.log" || fail "no flow-matching line"
metric_values long loss | awk '
  NR <= 5 { first += $1 } { v[NR] = $1 }
  END { for (i = NR - 49; i <= NR; i++) last += v[i]; first /= 5; last /= 50
        printf "flux debugmodel, 300 steps: loss %.4f (first 5 steps) -> %.4f (last 50)\n", first, last
        exit !(last < 0.7 * first) }' || fail "the flux debug model's loss did not fall by 30%"
[ "$(metric_values long validation_loss | wc -l)" = 3 ] || fail "expected 3 validation runs"
! grep -q validation_perplexity "$WORK/long/metrics.jsonl" || fail "perplexity of an MSE loss"
grep "validate step: 300" "$WORK/long.log"

# Sampling from the trained model (the Euler flow sampler, the same random encoders): a PNG that
# Pillow reads at the training size, the same bytes for the same seed, others for another seed
# or with classifier-free guidance.
gen=("$TITAN" generate --checkpoint "$WORK/long/checkpoint" --prompt "a red circle on a blue background" --steps 8)
expect_exit 0 "${gen[@]}" --output "$WORK/a.png" --seed 1
grep -q "wrote .*a.png (64x64)" "$WORK/out" || fail "no image written"
expect_exit 0 "${gen[@]}" --output "$WORK/b.png" --seed 1
cmp -s "$WORK/a.png" "$WORK/b.png" || fail "the same seed drew another image"
expect_exit 0 "${gen[@]}" --output "$WORK/c.png" --seed 2
! cmp -s "$WORK/a.png" "$WORK/c.png" || fail "another seed drew the same image"
expect_exit 0 "${gen[@]}" --output "$WORK/d.png" --seed 1 --guidance_scale 4
! cmp -s "$WORK/a.png" "$WORK/d.png" || fail "guidance changed nothing"
expect_exit 0 "$PY" -c "
import sys
from PIL import Image
im = Image.open(sys.argv[1]); im.load()
assert im.size == (64, 64) and im.mode == 'RGB', (im.size, im.mode)
lo, hi = min(im.getextrema(), key=lambda e: e[0])[0], max(im.getextrema(), key=lambda e: e[1])[1]
assert hi > lo, 'a flat image'
print('flux sample: 64x64 RGB PNG, values', lo, '..', hi)" "$WORK/a.png"
cat "$WORK/out"
expect_exit 2 "${gen[@]}" --seed 1
grep -q "give --output PATH" "$WORK/out" || fail "a missing --output not refused"

data_parallel_parity 7 "${short[@]}"

# Tensor parallelism (whole activations between layers; the fused q/k/v and the single blocks'
# [q, k, v, MLP] / [attention, MLP] weights split part by part): TP 2, and FSDP 2 x TP 2 with
# full activation checkpointing, reproduce the one-process run; checkpoints cross layouts both
# ways (the packed weights are saved as their plain pieces).
tp=(--parallelism.tensor_parallel_degree 2)
train_run tp2 2 "${short[@]}" --training.local_batch_size 8 "${tp[@]}" \
  --parallelism.data_parallel_shard_degree 1
grep -q "tensor parallel over 2 ranks (whole activations" "$WORK/tp2.log" || fail "no TP line"
same_as_one tp2
train_run fsdp2_tp2 4 "${short[@]}" --training.local_batch_size 4 --validation.local_batch_size 4 \
  "${tp[@]}" --parallelism.data_parallel_shard_degree 2 --activation_checkpoint.mode full
same_as_one fsdp2_tp2
train_run hsdp4 4 "${short[@]}" --training.local_batch_size 2 --validation.local_batch_size 2 \
  --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2
grep -q "HSDP: sharded over 2 ranks, replicated 2x" "$WORK/hsdp4.log" || fail "no HSDP line"
same_as_one hsdp4
for resume in "one tp2_resumed 2" "fsdp2_tp2 one_resumed 1"; do
  read -r from name ranks <<<"$resume"
  mkdir -p "$WORK/$name/checkpoint"
  cp -r "$WORK/$from/checkpoint/step-5" "$WORK/$name/checkpoint/"
  if [ "$ranks" = 2 ]; then
    train_run "$name" 2 "${short[@]}" --training.local_batch_size 8 "${tp[@]}" \
      --parallelism.data_parallel_shard_degree 1
  else
    train_run "$name" 1 "${short[@]}" --training.local_batch_size 8
  fi
  grep -q "resuming training after step 5" "$WORK/$name.log" || fail "$name did not resume"
  same_values one_tail "$name" loss "$REPEAT_TOL"
done
# The diffusers folder written at the end of a run (checkpoint.last_save_in_hf: diffusers' file
# names, no tokenizer) loads in diffusers; a TP 2 run's (its packed weights gathered whole) holds
# the one process's tensors.
hf=("${cfg[@]}" --training.steps 3 --debug.seed 7 --training.global_batch_size 8
  --training.local_batch_size 8 --checkpoint.enable true --checkpoint.interval 3
  --checkpoint.last_save_in_hf true --checkpoint.last_save_model_only true)
train_run hf_one 1 "${hf[@]}"
train_run hf_tp2 2 "${hf[@]}" "${tp[@]}" --parallelism.data_parallel_shard_degree 1
expect_exit 0 "$PY" -c "
import os, sys
from diffusers import FluxTransformer2DModel
folders = [f'{sys.argv[1]}/{r}/checkpoint/step-3-hf' for r in ('hf_one', 'hf_tp2')]
assert sorted(os.listdir(folders[0])) == ['config.json', 'diffusion_pytorch_model.safetensors'], \
    os.listdir(folders[0])
a, b = (FluxTransformer2DModel.from_pretrained(f).state_dict() for f in folders)
assert a.keys() == b.keys() and len(a) > 100, (len(a), len(b))
err = max((a[k] - b[k]).abs().max().item() for k in a)
assert err < 1e-6, err
print(f'diffusers loads the folder of TP 2 and of one process: {len(a)} tensors within {err:.1e}')" "$WORK"
cat "$WORK/out"
# Fine-tuning from a diffusers transformer folder (checkpoint.initial_load_in_hf) starts where the
# titan checkpoint it was written from does.
for init in hf_init:step-3-hf:true ckpt_init:step-3:false; do
  IFS=: read -r name folder in_hf <<<"$init"
  train_run "$name" 1 "${cfg[@]}" --training.steps 2 --debug.seed 7 --training.global_batch_size 8 \
    --training.local_batch_size 8 --checkpoint.initial_load_path "$WORK/hf_one/checkpoint/$folder" \
    --checkpoint.initial_load_in_hf "$in_hf"
done
same_values ckpt_init hf_init loss "$REPEAT_TOL"
expect_exit 2 "$TITAN" run --nproc_per_node 3 -- train "${short[@]}" --job.dump_folder "$WORK/x" \
  --parallelism.tensor_parallel_degree 3
grep -q "flux num_heads 4 is not divisible by tensor_parallel_degree 3 (4 % 3 = 1)" "$WORK/out" ||
  fail "tp 3 over 4 heads not refused"
expect_exit 2 "$TITAN" run --nproc_per_node 2 -- train "${short[@]}" --job.dump_folder "$WORK/x" \
  "${tp[@]}" --parallelism.data_parallel_shard_degree 1 --optimizer.name Muon
grep -q "Muon cannot yet orthogonalize double_blocks.0.img_attn.qkv.weight, a packed weight" \
  "$WORK/out" || fail "Muon over packed tensor-parallel weights not refused"

# Precomputed encodings (titan flux encode): training from them repeats the run that encodes on
# the fly (the same losses: moments, caption encodings and the drops of the same samples).
expect_exit 0 "$TITAN" flux encode --output "$WORK/latents" --rows 80 "${short[@]}"
grep "wrote 80 samples' encodings" "$WORK/out"
train_run cached 1 "${short[@]}" --training.local_batch_size 8 --training.dataset flux_latents \
  --training.dataset_path "$WORK/latents" --validation.enable false
grep '"loss":' "$WORK/one/metrics.jsonl" >"$WORK/one_losses"
mkdir -p "$WORK/one_only" && mv "$WORK/one_losses" "$WORK/one_only/metrics.jsonl"
same_values one_only cached loss "$REPEAT_TOL"
expect_exit 1 "$TITAN" train "${short[@]}" --job.dump_folder "$WORK/x" --training.img_size 32 \
  --training.dataset flux_latents --training.dataset_path "$WORK/latents"
grep -q "was encoded with img_size = 64, this run has 32" "$WORK/out" || fail "a mismatch not named"

expect_exit 2 "$TITAN" train "${cfg[@]}" --job.dump_folder "$WORK/x" --training.test_mode false
grep -q "encoder.t5_encoder: 'google/t5-v1_1-xxl' is not a folder" "$WORK/out" ||
  fail "test_mode false with no encoder folders not refused"
expect_exit 2 "$TITAN" train "${cfg[@]}" --job.dump_folder "$WORK/x" --training.dataset c4
grep -q 'training.dataset = "shapes"' "$WORK/out" || fail "a text dataset not refused"
expect_exit 2 "$TITAN" train "${cfg[@]}" --job.dump_folder "$WORK/x" --training.img_size 40
grep -q "multiple of 16" "$WORK/out" || fail "img_size 40 not refused"
expect_exit 2 "$TITAN" train "${cfg[@]}" --job.dump_folder "$WORK/x" --model.converters lora
grep -q "the flux model has none; its LoRA is not supported yet" "$WORK/out" ||
  fail "LoRA on flux not refused"

# Pretrained encoders (training.test_mode = false), loaded as TorchTitan loads them: T5 from a
# diffusers FLUX folder (a whole T5 whose decoder is left out, its tokenizer the tokenizer_2
# sibling's spiece.model), CLIP from a whole CLIPModel (vision tower left out) with its
# vocab.json + merges.txt, the autoencoder from a diffusers AutoencoderKL folder. `titan flux
# encode` gives transformers' and diffusers' encodings of the same captions (truncated, empty,
# accented, capitalised) and images; training and sampling run on the loaded encoders.
sotu="${TITAN_CACHE:-$HOME/.cache/titan}/datasets/sotu"
expect_exit 0 "$PY" "$(dirname "$0")/flux_pretrained_reference.py" write "$sotu" "$WORK/pre"
pre=("${cfg[@]}" --training.test_mode false --encoder.t5_encoder "$WORK/pre/FLUX/text_encoder_2"
  --encoder.clip_encoder "$WORK/pre/clip" --encoder.autoencoder_path "$WORK/pre/FLUX/vae"
  --training.dataset folder --training.dataset_path "$WORK/pre/images"
  --encoder.max_t5_encoding_len 32 --training.local_batch_size 2 --validation.enable false)
expect_exit 0 "$TITAN" flux encode --output "$WORK/pre_latents" "${pre[@]}"
expect_exit 0 "$PY" "$(dirname "$0")/flux_pretrained_reference.py" check "$WORK/pre" \
  "$WORK/pre_latents" 32
cat "$WORK/out"
# The autoencoder as black-forest-labs' ae.safetensors (their names, one file) encodes the same.
TITAN_FLUX_AE_FOLDER="$WORK/pre/FLUX/vae" TITAN_FLUX_AE_FILE="$WORK/pre/ae.safetensors" \
  expect_exit 0 "$TESTS" --gtest_filter='FluxFixture.WritesTheAutoencoderInBlackForestLabsNames'
grep -q "wrote .* autoencoder tensors in black-forest-labs' names" "$WORK/out" ||
  fail "the ae.safetensors fixture was not written"
expect_exit 0 "$TITAN" flux encode --output "$WORK/pre_latents_bfl" "${pre[@]}" \
  --encoder.autoencoder_path "$WORK/pre/ae.safetensors"
expect_exit 0 "$PY" "$(dirname "$0")/flux_pretrained_reference.py" check "$WORK/pre" \
  "$WORK/pre_latents_bfl" 32
grep "autoencoder moments" "$WORK/out"
train_run pretrained 1 "${pre[@]}" --training.steps 6 --checkpoint.enable true \
  --checkpoint.interval 6
grep -q "autoencoder from $WORK/pre/FLUX/vae" "$WORK/pretrained.log" ||
  fail "the run did not say where its encoders came from"
grep -q "captions tokenized by T5's tokenizer (vocab 1005) and CLIP's (vocab 1711)" \
  "$WORK/pretrained.log" || fail "the run did not use the encoders' tokenizers"
[ "$(metric_values pretrained loss | wc -l)" = 6 ] || fail "expected 6 losses"
expect_exit 0 "$TITAN" generate --checkpoint "$WORK/pretrained/checkpoint" --steps 2 \
  --prompt "A Red Square" --output "$WORK/pre.png" --seed 1
grep -q "T5 from $WORK/pre/FLUX/text_encoder_2" "$WORK/out" ||
  fail "sampling did not load the run's encoders"
# An encoder folder without a tokenizer (nor a sibling with one) is named.
expect_exit 2 "$TITAN" train "${pre[@]}" --job.dump_folder "$WORK/x" \
  --encoder.clip_encoder "$WORK/pre/FLUX/vae"
grep -q "encoder.clip_encoder: '$WORK/pre/FLUX/vae' holds no tokenizer" "$WORK/out" ||
  fail "an encoder folder without a tokenizer not refused"

# A diffusers FluxPipeline folder (as FLUX.1-dev and -schnell are published) samples as
# diffusers' FluxPipeline does: the same PNG from the same noise (torch.randn of a CPU generator
# seeded alike) for a guidance-distilled model with a shifted schedule and classifier-free
# guidance against the empty prompt, and for a schnell-like one. A changed prompt moves most
# pixels, so the agreement is the transformer's too.
prompt="A Red Square, at the top"
expect_exit 0 "$PY" "$(dirname "$0")/flux_pretrained_reference.py" pipeline "$WORK/pre" \
  "$WORK/pipe" "$prompt" 5 4
grep "^FluxPipeline" "$WORK/out"
pipe_gen() {  # VARIANT OUTPUT PROMPT [FLAGS...]
  local variant="$1" output="$2" text="$3"; shift 3
  expect_exit 0 "$TITAN" generate --checkpoint "$WORK/pipe/$variant" --prompt "$text" --seed 5 \
    --steps 4 --img_size 64 --output "$WORK/pipe/$output.png" "$@"
}
pipe_gen dev ours_dev "$prompt" --guidance 3.5 --guidance_scale 2
grep -q "T5 from $WORK/pipe/dev/text_encoder_2, CLIP from $WORK/pipe/dev/text_encoder" \
  "$WORK/out" || fail "the pipeline's encoders not used"
pipe_gen schnell ours_schnell "$prompt"
pipe_gen dev other_prompt "a green circle" --guidance 3.5 --guidance_scale 2
expect_exit 0 "$PY" -c "
import sys
import numpy as np
from PIL import Image
png = lambda name: np.asarray(Image.open(f'{sys.argv[1]}/{name}.png').convert('RGB')).astype(int)
for v in ('dev', 'schnell'):
    d = np.abs(png(v) - png('ours_' + v))
    print(f'{v}: titan vs FluxPipeline: max |diff| {d.max()}, {(d > 0).mean():.3%} of the values differ')
    assert d.max() <= 1 and (d > 0).mean() < 0.005, v
moved = (png('dev') != png('other_prompt')).mean()
print(f'another prompt moves {moved:.0%} of the values')
assert moved > 0.5, moved" "$WORK/pipe"
cat "$WORK/out"
# Pipelines the sampler does not draw are refused naming the reason.
cp -r "$WORK/pipe/dev" "$WORK/pipe/karras"
sed -i 's/"use_karras_sigmas": false/"use_karras_sigmas": true/' \
  "$WORK/pipe/karras/scheduler/scheduler_config.json"
expect_exit 2 "$TITAN" generate --checkpoint "$WORK/pipe/karras" --prompt x --output "$WORK/x.png"
grep -q "use_karras_sigmas = true is a schedule titan's sampler does not draw" "$WORK/out" ||
  fail "a Karras schedule not refused"
sed -i 's/"FluxPipeline"/"StableDiffusionPipeline"/' "$WORK/pipe/karras/model_index.json"
expect_exit 2 "$TITAN" generate --checkpoint "$WORK/pipe/karras" --prompt x --output "$WORK/x.png"
grep -q "is a diffusers StableDiffusionPipeline pipeline; titan samples from FluxPipeline" \
  "$WORK/out" || fail "another pipeline not refused"
# A pipeline's root folder where a model folder is expected is refused naming the transformer's.
expect_exit 2 "$TITAN" train "${cfg[@]}" --job.dump_folder "$WORK/x" \
  --checkpoint.initial_load_path "$WORK/pipe/dev" --checkpoint.initial_load_in_hf true
grep -q "is a diffusers pipeline folder (model_index.json); .* e.g. $WORK/pipe/dev/transformer" \
  "$WORK/out" || fail "a pipeline folder as initial_load_path not refused"
echo "PASS test_flux (training)"
