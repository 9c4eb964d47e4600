#!/usr/bin/env bash
# One-shot check of titan.cpp on a machine with an NVIDIA GPU, within 8 minutes on 16 cores. The
# default run, in this order (seconds: the estimate for one H200 and 16 cores, then the cap):
#
#   preflight    a CUDA device is visible to the Python's torch (else: exit 2 with a message)
#                                                                                   ~5     60
#   build        titan and the CUDA tests' binaries (target titan_cuda_tests) against that
#                torch's libtorch (CUDA), -j cores                                  ~210   330
#   unit         the unit tests about CUDA (ctest -L cuda: device selection, pinned staging,
#                device state in checkpoints, float8, MoE experts in float8 / MXFP8, Gloo over
#                CUDA tensors, side streams, FSDP with ranks sharing the GPU); every filter
#                must select tests                                                  ~25    90
#   parity       the debug model, float32, 10 steps on the GPU and on the CPU: every step's loss
#                within 1e-4 relative; and debug.deterministic: a second GPU run repeats the
#                first one's losses bit for bit                                     ~30    90
#   shared_parallel  FSDP 2, TP 2 and PP 2 as two processes sharing the GPU (TITAN_SHARED_DEVICE=1,
#                Gloo over CUDA tensors) against the one-rank GPU run, the four jobs at once:
#                every step's loss within 1e-4 relative                             ~25    90
#   image_models FLUX's and the vision-language model's debug flavors, float32, 10 steps: one rank
#                on the GPU against TP 2 as two processes sharing it (FLUX: whole activations,
#                packed q/k/v; VLM: the decoder sequence-parallel), the four jobs at once:
#                every step's loss within 1e-4 relative                             ~15    60
#   titan_bf16   Llama 3 8B's shapes cut to 8 layers (flavor 8B_cut), bf16, batch 1 x seq 8192:
#                tokens/s, TFLOP/s, MFU, device memory (from metrics.jsonl)         ~45    120
#   ref_eager    the same model and step in plain PyTorch, eager (bench/torch_reference.py)
#                                                                                   ~35    90
#   float8       titan_bf16 with model.converters = quantize.linear.float8 (tensorwise), on compute
#                capability >= 8.9; else recorded as skipped with the capability   ~45    120
#   ref_compile  the same model in PyTorch with torch.compile per block, as TorchTitan's
#                compile.enable: only when at least 110 s of the budget are left (compiling
#                takes most of it); else skipped, saying so                         ~100   150
#
# The estimates add up to about 435 s without ref_compile, 535 s with it: on a slower machine
# ref_compile is left out (run it alone with --stages ref_compile). Measured on one H200 with 16
# cores (2026-12-04, torch 2.11): the whole default run took 180 s: build 94, unit 5, parity 6,
# shared_parallel 5, titan_bf16 16, ref_eager 11, float8 16, ref_compile 22 (inductor, 8 s of
# compiling). --stages adds the build stage when a listed stage runs titan (not with --skip-build).
#
# It writes a Markdown summary (each stage's status and time, which figures were measured on the
# GPU and which stages were skipped and why, the parities, titan/PyTorch ratios), printed at the
# end. Every command runs under a timeout; the stages share a budget (GPU_CHECK_BUDGET_S), so the
# script ends, summary written, even when something hangs.
#
# Preparation on a dev machine (the GPU machine has no package registry): scripts/gpu_deps.sh
# writes .gpu-deps/ (headers, CMake configs, GoogleTest sources, the corpus); take it along with
# the checkout. Then, on the GPU machine, from the repository root:
#
#   scripts/gpu_check.sh [--summary FILE] [--build-dir DIR] [--work DIR] [--stages a,b,...]
#                        [--skip-build] [--configure-only] [--cpu-dry-run]
#
#   --summary FILE    where the summary goes (default: GPU_CHECK_SUMMARY, else
#                     <build-dir>/gpu_check_summary.md)
#   --build-dir DIR   build folder (default build-gpu); --skip-build uses the titan there
#   --work DIR        run folders and logs/ (default <build-dir>/gpu_check; emptied first)
#   --stages LIST     only these stages (preflight always runs), e.g. ref_compile alone
#   --configure-only  stop after CMake's configure step (checks the dependency flow)
#   --cpu-dry-run     no GPU needed: every stage runs on the CPU with small sizes (debugmodel,
#                     emulated float8, torch.compile's aot_eager backend, the CUDA tests' CPU
#                     parts) to exercise the script; the summary says in bold that no GPU was used
#
# Environment: TITAN_PYTHON (default python3: the Python whose torch we build against and whose
# torch runs the references), CUDA_TOOLKIT_ROOT_DIR (default: the nvcc on PATH or /usr/local/cuda,
# else the toolkit view of the NVIDIA wheels, cmake/titan_torch.cmake), TITAN_CUDA_ARCH_LIST
# (default: the GPU's compute capability, else 9.0), GPU_CHECK_JOBS (default: all cores),
# GPU_CHECK_BUDGET_S (default 480: 8 minutes), GPU_CHECK_DEPS (default .gpu-deps),
# GPU_CHECK_FLAVOR / _SEQ / _BATCH / _STEPS / _WARMUP (8B_cut, 8192, 1, 10, 3),
# GPU_CHECK_PARITY_RTOL (1e-4), GPU_CHECK_COMPILE_NEED_S (110: ref_compile's share of the budget).
#
# Exit status: 0 when every stage that ran passed, 1 when one failed or timed out, 2 when no GPU
# is visible (without --cpu-dry-run) or the arguments are wrong.
set -uo pipefail  # not -e: a stage's failure is recorded and the next stage still runs

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2

usage() { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() {
  echo "gpu_check: error: $*" >&2
  exit 2
}

summary="${GPU_CHECK_SUMMARY:-}"
build_dir="$root/build-gpu"
work=""
stages_arg=""
skip_build=0
configure_only=0
dry_run=0
while (($#)); do
  case "$1" in
    --summary) summary="${2:?--summary needs a file}"; shift 2 ;;
    --build-dir) build_dir="${2:?--build-dir needs a folder}"; shift 2 ;;
    --work) work="${2:?--work needs a folder}"; shift 2 ;;
    --stages) stages_arg="${2:?--stages needs a list}"; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --configure-only) configure_only=1; shift ;;
    --cpu-dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
all_stages=(build unit parity shared_parallel image_models titan_bf16 ref_eager float8 ref_compile)
for name in ${stages_arg//,/ }; do
  [[ " ${all_stages[*]} preflight " == *" $name "* ]] ||
    die "unknown stage '$name' in --stages; the stages are: ${all_stages[*]}"
done
# The stages that run titan need the build stage first (a fresh machine has no titan): --stages
# adds it unless --skip-build says the titan in the build folder is to be used.
titan_stages=(unit parity shared_parallel image_models titan_bf16 float8)
needs_titan=0
for name in "${titan_stages[@]}"; do
  [[ -z "$stages_arg" || ",$stages_arg," == *",$name,"* ]] && needs_titan=1
done
if [[ -n "$stages_arg" && ",$stages_arg," != *",build,"* ]] && ((needs_titan && !skip_build)); then
  echo "[gpu_check] --stages $stages_arg runs titan: the build stage comes first (--skip-build" \
    "uses the titan in the build folder)"
  stages_arg="build,$stages_arg"
fi
mkdir -p "$build_dir" || die "cannot create $build_dir"
build_dir="$(cd "$build_dir" && pwd)"
work="${work:-$build_dir/gpu_check}"
summary="${summary:-$build_dir/gpu_check_summary.md}"
case "$summary" in /*) ;; *) summary="$PWD/$summary" ;; esac

PY="${TITAN_PYTHON:-python3}"
JOBS="${GPU_CHECK_JOBS:-$(nproc)}"
BUDGET="${GPU_CHECK_BUDGET_S:-480}"
DEPS="${GPU_CHECK_DEPS:-$root/.gpu-deps}"
RTOL="${GPU_CHECK_PARITY_RTOL:-1e-4}"
COMPILE_NEED="${GPU_CHECK_COMPILE_NEED_S:-110}"
TITAN="$build_dir/titan"
SMALL=()  # dry run: titan on one thread (as the reference) and a smaller parity batch
if ((dry_run)); then
  DEVICE=cpu
  SMALL=(--training.num_threads 1)
  SHARED_SEQ=32 SHARED_BATCH=4 SHARED_THREADS=1
  FLAVOR="${GPU_CHECK_FLAVOR:-debugmodel}" SEQ="${GPU_CHECK_SEQ:-128}"
  BATCH="${GPU_CHECK_BATCH:-2}" STEPS="${GPU_CHECK_STEPS:-4}" WARMUP="${GPU_CHECK_WARMUP:-2}"
else
  DEVICE=cuda
  SHARED_SEQ=256 SHARED_BATCH=8 SHARED_THREADS=2  # 7 processes at once on the cores
  FLAVOR="${GPU_CHECK_FLAVOR:-8B_cut}" SEQ="${GPU_CHECK_SEQ:-8192}"
  BATCH="${GPU_CHECK_BATCH:-1}" STEPS="${GPU_CHECK_STEPS:-10}" WARMUP="${GPU_CHECK_WARMUP:-3}"
fi
for v in JOBS BUDGET SEQ BATCH STEPS WARMUP COMPILE_NEED; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v='${!v}' is not a positive integer"
done

# CMake, Ninja and CTest may come as Python packages next to that Python (a virtual environment
# that is not activated): its bin folder then joins PATH.
py_bin="$(dirname "$(command -v "$PY" 2>/dev/null || echo "$PY")")"
for tool in cmake ninja ctest; do
  if ! command -v "$tool" >/dev/null 2>&1 && [[ -x "$py_bin/$tool" ]]; then
    PATH="$py_bin:$PATH"
  fi
done

# The corpus and tokenizer: .gpu-deps/cache when prepared, else the usual titan cache.
[[ -d "$DEPS/cache/datasets/sotu" ]] && export TITAN_CACHE="$DEPS/cache"
CACHE="${TITAN_CACHE:-$HOME/.cache/titan}"
TOKENIZER="$CACHE/tokenizers/sotu_2k"

# The work folder is emptied: only one that a previous check made (or an empty one).
if [[ -d "$work" && -n "$(ls -A "$work")" && ! -f "$work/stages.tsv" ]]; then
  die "--work $work holds files of something else; name an empty or new folder"
fi
rm -rf "$work"
mkdir -p "$work/logs" || die "cannot create $work"
: >"$work/stages.tsv"
START=$SECONDS
FAILED=0

# ---- stage machinery ---------------------------------------------------------------------------

wanted() {
  [[ -z "$stages_arg" ]] && return 0
  [[ ",$stages_arg," == *",$1,"* ]]
}

record() {  # record NAME STATUS SECONDS NOTE
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$work/stages.tsv"
}

write_summary() {
  "$PY" "$root/scripts/gpu_check_report.py" summary "$work" "$summary" 2>>"$work/logs/report.log" ||
    echo "gpu_check: could not write the summary (see $work/logs/report.log)" >&2
}

# run_cmd CMD...: CMD under the current stage's deadline, its output appended to the stage's log.
# 124 when the deadline passed (timeout's status; 137 if it had to be killed).
run_cmd() {
  local left=$((STAGE_END - SECONDS))
  ((left > 0)) || return 124
  echo "+ $*" >>"$STAGE_LOG"
  timeout -k 10 "$left" "$@" >>"$STAGE_LOG" 2>&1
}

# stage NAME LIMIT_S FUNCTION [NEED_S]: runs FUNCTION with a deadline of min(LIMIT_S, budget
# left) and records its status, its seconds and the NOTE it sets. FUNCTION returns 0 (ok), 3
# (skipped: NOTE says why), 124/137 (timed out) or anything else (failed). With NEED_S, a stage
# that the default run holds only when time is left: with less than NEED_S of the budget left it
# is skipped (not a failure) unless --stages names it.
stage() {
  local name="$1" limit="$2" fn="$3" need="${4:-0}"
  if ! wanted "$name"; then
    return 0
  fi
  local left=$((BUDGET - (SECONDS - START)))
  if ((need > 0 && left < need)) && [[ -z "$stages_arg" ]]; then
    record "$name" "skipped" 0 "needs ~${need} s, ${left} s of the ${BUDGET} s budget were left; \
run it alone: scripts/gpu_check.sh --stages $name"
    echo "[gpu_check] $name: skipped (${left} s left, needs ~${need} s)"
    write_summary
    return 0
  fi
  if ((left < 15)); then
    record "$name" "NOT RUN" 0 "the ${BUDGET} s budget was spent (GPU_CHECK_BUDGET_S)"
    FAILED=1
    write_summary
    return 0
  fi
  ((limit > left)) && limit=$left
  STAGE_LOG="$work/logs/$name.log"
  STAGE_END=$((SECONDS + limit))
  NOTE=""
  : >"$STAGE_LOG"
  echo "[gpu_check] $name (limit ${limit} s)"
  local t0=$SECONDS rc status
  "$fn"
  rc=$?
  case "$rc" in
    0) status="ok" ;;
    3) status="skipped" ;;
    124 | 137) status="TIMEOUT"; NOTE="stopped after ${limit} s${NOTE:+; $NOTE}" ;;
    *) status="FAIL" ;;
  esac
  if [[ "$status" == FAIL || "$status" == TIMEOUT ]]; then
    FAILED=1
    NOTE="${NOTE:+$NOTE; }log: logs/$name.log"
    echo "[gpu_check] $name: $status; the end of $STAGE_LOG:" >&2
    tail -n 25 "$STAGE_LOG" >&2
  fi
  echo "[gpu_check] $name: $status in $((SECONDS - t0)) s${NOTE:+: $NOTE}"
  record "$name" "$status" "$((SECONDS - t0))" "$NOTE"
  write_summary
}

json_get() {  # json_get FILE KEY [FORMAT]: a top-level value of the last JSON line in FILE
  "$PY" - "$1" "$2" "${3:-}" <<'EOF'
import json, sys
try:
    value = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]).get(sys.argv[2])
except Exception:
    value = None
if value is None:
    print("-")
elif sys.argv[3] and isinstance(value, (int, float)):
    print(format(value, sys.argv[3]))
else:
    print(value)
EOF
}

# ---- stages ------------------------------------------------------------------------------------

preflight() {
  local nvcc_text="-" driver="-" git_text="-"
  detect_nvcc_root
  [[ -n "$NVCC_ROOT" ]] && nvcc_text="$("$NVCC_ROOT/bin/nvcc" --version 2>/dev/null | tail -n 1)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    run_cmd nvidia-smi -L
    driver="$(timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null |
      head -n 1)"
  fi
  git_text="$(git -C "$root" log -1 --format='%h %s' 2>/dev/null | cut -c1-80)"
  if [[ -n "$git_text" && -n "$(git -C "$root" status --porcelain 2>/dev/null | head -n 1)" ]]
  then
    git_text+=" (with local changes)"
  fi
  local shape="llama3 ${FLAVOR}, bf16, batch ${BATCH} x seq ${SEQ}"
  shape+=", ${STEPS} timed steps after ${WARMUP}"
  NOTE="$PY could not import torch or ask it about CUDA (see the log). HINT: set TITAN_PYTHON "
  NOTE+="to the Python whose torch titan should build against"
  run_cmd "$PY" - "$work" "$dry_run" "$BUDGET" "$JOBS" "$nvcc_text" "${driver:--}" \
    "${git_text:--}" "$shape" <<'EOF' || return 1
import json, os, platform, shlex, socket, sys, time
work, dry_run, budget, jobs, nvcc, driver, git, shape = sys.argv[1:]
import torch
env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": socket.gethostname(),
       "cores": os.cpu_count(), "jobs": int(jobs), "budget_s": int(budget),
       "dry_run": dry_run == "1", "python": platform.python_version(), "torch": torch.__version__,
       "torch_cuda": torch.version.cuda or "-", "nvcc": nvcc, "driver": driver, "git": git,
       "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI), "speed_shape": shape,
       "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0}
if env["cuda_devices"]:
    p = torch.cuda.get_device_properties(0)
    env.update(gpu=p.name, capability="%d.%d" % (p.major, p.minor),
               gpu_memory_gib=p.total_memory / 2**30)
with open(os.path.join(work, "env.json"), "w") as f:
    json.dump(env, f)
with open(os.path.join(work, "env.sh"), "w") as f:
    for key in ("cuda_devices", "cxx11_abi", "capability", "gpu", "torch"):
        f.write("ENV_%s=%s\n" % (key.upper(), shlex.quote(str(env.get(key, "")))))
print(json.dumps(env))
EOF
  NOTE=""
  # shellcheck source=/dev/null
  source "$work/env.sh"
  if ((ENV_CUDA_DEVICES == 0)) && ((!dry_run)); then
    NOTE="no CUDA device visible to $PY (torch ${ENV_TORCH}). HINT: run on a GPU machine, check "
    NOTE+="CUDA_VISIBLE_DEVICES and nvidia-smi, or pass --cpu-dry-run to exercise the script"
    return 1
  fi
  if ((dry_run)); then
    NOTE="CPU dry run: no GPU used (torch ${ENV_TORCH}, ${ENV_CUDA_DEVICES} CUDA devices seen)"
  else
    NOTE="${ENV_GPU} (compute capability ${ENV_CAPABILITY}), torch ${ENV_TORCH}"
  fi
}

# NVCC_ROOT: the CUDA toolkit to hand CMake: CUDA_TOOLKIT_ROOT_DIR, else the nvcc on PATH, else
# /usr/local/cuda; empty when there is none (the wheels' toolkit view then).
detect_nvcc_root() {
  NVCC_ROOT="${CUDA_TOOLKIT_ROOT_DIR:-}"
  if [[ -z "$NVCC_ROOT" ]] && command -v nvcc >/dev/null 2>&1; then
    NVCC_ROOT="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  fi
  if [[ -z "$NVCC_ROOT" && -x /usr/local/cuda/bin/nvcc ]]; then
    NVCC_ROOT=/usr/local/cuda
  fi
  [[ -z "$NVCC_ROOT" || -x "$NVCC_ROOT/bin/nvcc" ]] || NVCC_ROOT=""
}

# DEP_ARGS: CMake arguments for toml++, nlohmann_json, GoogleTest and gloo's headers: .gpu-deps
# when prepared (GoogleTest built here with this machine's compiler and torch's C++ ABI), nothing
# when the system has them (a dev machine).
prepare_deps() {
  DEP_ARGS=()
  if [[ ! -d "$DEPS/include" ]]; then
    if [[ -d /usr/include/toml++ && -d /usr/include/nlohmann && -d /usr/include/gloo ]]; then
      DEP_NOTE="system headers"
      return 0
    fi
    NOTE="no $DEPS and no system toml++/nlohmann/gloo headers. HINT: run scripts/gpu_deps.sh on "
    NOTE+="a dev machine and bring .gpu-deps/ along with the checkout"
    return 1
  fi
  local gtest_prefix="$build_dir/_deps/gtest" gtest_dir
  gtest_dir="$(find "$gtest_prefix" -name GTestConfig.cmake -printf '%h\n' 2>/dev/null | head -n 1)"
  if [[ -z "$gtest_dir" ]]; then
    run_cmd cmake -S "$DEPS/src/googletest" -B "$build_dir/_deps/gtest-build" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON \
      -DCMAKE_INSTALL_PREFIX="$gtest_prefix" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=${ENV_CXX11_ABI:-1}" || return
    run_cmd cmake --build "$build_dir/_deps/gtest-build" -j "$JOBS" || return
    run_cmd cmake --install "$build_dir/_deps/gtest-build" || return
  fi
  gtest_dir="$(find "$gtest_prefix" -name GTestConfig.cmake -printf '%h\n' 2>/dev/null | head -n 1)"
  if [[ -z "$gtest_dir" ]]; then
    NOTE="GoogleTest built, but no GTestConfig.cmake in $gtest_prefix"
    return 1
  fi
  DEP_ARGS=(-Dtomlplusplus_DIR="$DEPS/cmake/tomlplusplus"
    -Dnlohmann_json_DIR="$DEPS/cmake/nlohmann_json" -DGTest_DIR="$gtest_dir"
    -DCMAKE_CXX_FLAGS="-isystem $DEPS/include" -DCMAKE_PREFIX_PATH="$DEPS")
  DEP_NOTE="deps from ${DEPS#"$root/"}"
}

configure() {
  ARCH="${TITAN_CUDA_ARCH_LIST:-${ENV_CAPABILITY:-9.0}}"
  local args=(-S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DTITAN_PYTHON="$(command -v "$PY" || echo "$PY")" -DTITAN_CUDA_ARCH_LIST="$ARCH"
    "${DEP_ARGS[@]}")
  # Parquet datasets need pyarrow's Arrow libraries; a Python without it builds without them.
  if ! "$PY" -c 'import pyarrow' >/dev/null 2>&1; then
    args+=(-DTITAN_PARQUET=OFF)
    DEP_NOTE+="; no pyarrow in $PY: built without parquet datasets"
  fi
  detect_nvcc_root
  if [[ -n "$NVCC_ROOT" ]]; then
    if run_cmd cmake "${args[@]}" -DCUDA_TOOLKIT_ROOT_DIR="$NVCC_ROOT"; then
      CUDA_NOTE="CUDA toolkit $NVCC_ROOT"
      return 0
    fi
    # A system toolkit CMake could not use (another CUDA release, missing libraries): the view of
    # torch's NVIDIA wheels instead, from a clean cache.
    echo "gpu_check: configure with $NVCC_ROOT failed; retrying with the wheels' toolkit" \
      >>"$STAGE_LOG"
    rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
  fi
  run_cmd cmake "${args[@]}" || return
  CUDA_NOTE="CUDA toolkit: view of the NVIDIA wheels"
}

build() {
  if ((skip_build)); then
    [[ -x "$TITAN" ]] || { NOTE="--skip-build, but no $TITAN"; return 1; }
    NOTE="--skip-build: $TITAN as it is"
    return 3
  fi
  local tool
  for tool in cmake ninja; do
    command -v "$tool" >/dev/null 2>&1 || { NOTE="no $tool on PATH (nor next to $PY)"; return 1; }
  done
  prepare_deps || return
  configure || return
  if ((configure_only)); then
    NOTE="configured only (${DEP_NOTE}; ${CUDA_NOTE}; arch ${ARCH})"
    return 0
  fi
  # The unit stage's binaries only (titan_cuda_tests: the ctest cases labelled cuda); the CPU CI
  # runs all the others.
  local targets=(titan)
  wanted unit && targets+=(titan_cuda_tests)
  run_cmd ninja -C "$build_dir" -j "$JOBS" "${targets[@]}" || return
  NOTE="${targets[*]}, -j ${JOBS}; ${DEP_NOTE}; ${CUDA_NOTE}"
}

# The CUDA tests (ctest -L cuda: filters of the unit binaries, see CMakeLists.txt). Each case's
# output is kept (-V) to count what its filter selected, ran and skipped: a filter that selects
# nothing is a failure, and on a GPU every skip is named in the note.
unit() {
  (cd "$build_dir" && run_cmd ctest -L '^cuda$' -V -j "$(((JOBS + 1) / 2))" --timeout 80)
  local rc=$?
  NOTE="$(grep -E 'tests passed' "$STAGE_LOG" | tail -n 1)"
  if [[ $rc -ne 0 ]]; then
    NOTE+="; failed: $(grep -E '^[[:space:]]+[0-9]+ - cuda_' "$STAGE_LOG" |
      sed -E 's/^[[:space:]]+[0-9]+ - //' | paste -sd ',' -)"
  fi
  local ran skipped empty
  ran="$(grep -cE '^[0-9]+: \[       OK \]' "$STAGE_LOG")"
  skipped="$(grep -E '^[0-9]+: \[  SKIPPED \] [A-Za-z]' "$STAGE_LOG" | sed -E 's/^[0-9]+: \[  SKIPPED \] //;
    s/ \(.*//' | sort -u)"
  empty="$(grep -cE '^[0-9]+: \[==========\] 0 tests from' "$STAGE_LOG")"
  [[ -z "$NOTE" ]] && NOTE="no ctest case labelled cuda ran"
  NOTE+="; ${ran} tests ran, $(grep -c . <<<"$skipped") skipped"
  if ((!dry_run)) && [[ -n "$skipped" ]]; then
    NOTE+=" ($(paste -sd ',' - <<<"$skipped"))"
  fi
  if ((empty > 0)); then
    NOTE+="; ${empty} filter(s) selected no test (see the log)"
    rc=1
  fi
  ((ran > 0)) || rc=1
  return $rc
}

# The corpus and the tokenizer the titan runs use (trained here when not brought along).
ensure_data() {
  if [[ ! -f "$CACHE/datasets/sotu/.fetched" ]]; then
    NOTE="no sotu corpus in $CACHE/datasets. HINT: scripts/gpu_deps.sh brings it in .gpu-deps/"
    return 1
  fi
  [[ -f "$TOKENIZER/tokenizer.json" ]] && return 0
  run_cmd "$TITAN" tokenizer train --dataset sotu --dataset-path "$CACHE/datasets/sotu" \
    --vocab-size 2048 --output "$TOKENIZER"
}

titan_train() {  # titan_train NAME DEVICE CONFIG OVERRIDES...: a run in $work/NAME
  local name="$1" device="$2" config="$3"
  shift 3
  run_cmd "$TITAN" train --job.config_file "$config" --job.dump_folder "$work/$name" \
    --training.device "$device" --model.hf_assets_path "$TOKENIZER" --validation.enable=false \
    --checkpoint.enable=false --metrics.disable_color_printing "${SMALL[@]}" "$@"
}

parity() {
  ensure_data || return
  local common=(--training.steps 10 --metrics.log_freq 1 --training.mixed_precision_param float32
    --lr_scheduler.warmup_steps 2 --debug.seed 42)
  ((dry_run)) && common+=(--training.seq_len 64 --training.local_batch_size 2)
  titan_train parity_gpu "$DEVICE" configs/llama3/debug_model.toml "${common[@]}" \
    --debug.deterministic || return
  titan_train parity_cpu cpu configs/llama3/debug_model.toml "${common[@]}" || return
  run_cmd "$PY" "$root/scripts/gpu_check_report.py" parity "$work/parity_gpu/metrics.jsonl" \
    "$work/parity_cpu/metrics.jsonl" --steps 10 --rtol "$RTOL"
  local rc=$?
  tail -n 1 "$STAGE_LOG" >"$work/parity.json"
  NOTE="$DEVICE vs cpu: max relative loss difference $(json_get "$work/parity.json" max_rel .2e)"
  NOTE+=" over 10 steps (tolerance $RTOL)"
  # debug.deterministic: the same run again on the GPU gives the same losses bit for bit.
  titan_train parity_gpu_again "$DEVICE" configs/llama3/debug_model.toml "${common[@]}" \
    --debug.deterministic || return
  run_cmd "$PY" "$root/scripts/gpu_check_report.py" parity "$work/parity_gpu/metrics.jsonl" \
    "$work/parity_gpu_again/metrics.jsonl" --steps 10 --rtol 0
  local rc_again=$?
  tail -n 1 "$STAGE_LOG" >"$work/determinism.json"
  NOTE+="; deterministic rerun: max relative difference"
  NOTE+=" $(json_get "$work/determinism.json" max_rel .2e) (must be 0)"
  ((rc != 0)) && return $rc
  return $rc_again
}

# The background jobs of a stage, by name (started with `&`, JOB_PIDS[name]=$!).
declare -A JOB_PIDS=()
# wait_jobs STEM NAME...: waits for each named job, whose log is logs/STEM_NAME.log; a failed
# one's last lines go to the stage log and NOTE names it. Returns 124 when one ran out of time,
# 1 when one failed otherwise.
wait_jobs() {
  local stem="$1" name code rc=0 failed=()
  shift
  for name in "$@"; do
    wait "${JOB_PIDS[$name]}"
    code=$?
    if ((code != 0)); then
      failed+=("$name (exit $code)")
      ((code == 124 || code == 137)) && rc=124
      ((rc == 0)) && rc=1
      tail -n 20 "$work/logs/${stem}_$name.log" >>"$STAGE_LOG"
    fi
  done
  ((${#failed[@]} == 0)) || NOTE="failed: ${failed[*]} (logs/${stem}_*.log)"
  return $rc
}

# The shared-device test mode (TITAN_SHARED_DEVICE=1): FSDP 2, TP 2 and PP 2, each as two
# processes on one GPU over Gloo (host copies of the CUDA tensors), so that FSDP's side streams
# and the TP / PP exchanges run with real CUDA asynchrony; every step's loss within RTOL of the
# one-rank run on the same device, same global batch (not debug.deterministic: the tolerance
# covers the GPU's summation orders, and a parallel layout may use an op without a deterministic
# CUDA kernel, which that mode refuses). The four jobs run at once (the debug model leaves the
# GPU mostly idle); on the CPU dry run the same jobs run on the CPU.
shared_parallel() {
  ensure_data || return
  local common=(--job.config_file configs/llama3/debug_model.toml --training.device "$DEVICE"
    --model.hf_assets_path "$TOKENIZER" --validation.enable=false --checkpoint.enable=false
    --metrics.disable_color_printing --training.num_threads "$SHARED_THREADS"
    --training.steps 10 --metrics.log_freq 1 --training.mixed_precision_param float32
    --lr_scheduler.warmup_steps 2 --debug.seed 42
    --training.seq_len "$SHARED_SEQ" --training.global_batch_size "$SHARED_BATCH")
  local half=$((SHARED_BATCH / 2))
  local -A layouts=(
    [fsdp2]="--parallelism.data_parallel_shard_degree 2 --training.local_batch_size $half"
    [tp2]="--parallelism.tensor_parallel_degree 2 --training.local_batch_size $SHARED_BATCH"
    [pp2]="--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 1
      --training.local_batch_size $SHARED_BATCH"
  )
  local names=(fsdp2 tp2 pp2) name left=$((STAGE_END - SECONDS)) rc=0
  ((left > 0)) || return 124
  echo "+ the one-rank run and ${names[*]} at once; their logs: logs/shared_*.log" >>"$STAGE_LOG"
  timeout -k 10 "$left" "$TITAN" train "${common[@]}" --training.local_batch_size "$SHARED_BATCH" \
    --job.dump_folder "$work/shared_one" >"$work/logs/shared_one.log" 2>&1 &
  JOB_PIDS[one]=$!
  for name in "${names[@]}"; do
    # shellcheck disable=SC2086  # the layout's flags split on purpose
    TITAN_SHARED_DEVICE=1 timeout -k 10 "$left" "$TITAN" run --nproc_per_node 2 -- train \
      "${common[@]}" ${layouts[$name]} --job.dump_folder "$work/shared_$name" \
      >"$work/logs/shared_$name.log" 2>&1 &
    JOB_PIDS[$name]=$!
  done
  wait_jobs shared one "${names[@]}" || return
  if [[ "$DEVICE" == cuda ]] && ! grep -q "TEST MODE (TITAN_SHARED_DEVICE=1)" \
    "$work/logs/shared_fsdp2.log"; then
    NOTE="the FSDP 2 ranks did not report the shared-device test mode (logs/shared_fsdp2.log)"
    return 1
  fi
  NOTE="${DEVICE}, 2 ranks each vs 1 rank, max relative loss difference over 10 steps:"
  for name in "${names[@]}"; do
    run_cmd "$PY" "$root/scripts/gpu_check_report.py" parity "$work/shared_$name/metrics.jsonl" \
      "$work/shared_one/metrics.jsonl" --steps 10 --rtol "$RTOL" || rc=1
    tail -n 1 "$STAGE_LOG" >"$work/shared_$name.json"
    NOTE+=" $name $(json_get "$work/shared_$name.json" max_rel .2e)"
  done
  NOTE+=" (tolerance $RTOL)"
  return $rc
}

# FLUX (flow matching on the procedural shapes, random encoders) and the VLM (captions of them)
# have not met a GPU otherwise: each debug flavor one rank on $DEVICE and TP 2 in the
# shared-device mode, every step's loss within RTOL.
image_models() {
  ensure_data || return
  local common=(--training.device "$DEVICE" --model.hf_assets_path "$TOKENIZER"
    --validation.enable=false --checkpoint.enable=false --metrics.disable_color_printing
    --training.num_threads "$SHARED_THREADS" --training.steps 10 --metrics.log_freq 1
    --training.mixed_precision_param float32 --lr_scheduler.warmup_steps 2 --debug.seed 7
    --training.global_batch_size 8 --training.local_batch_size 8)
  local tp=(--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 1)
  local left=$((STAGE_END - SECONDS)) model rc=0
  ((left > 0)) || return 124
  echo "+ flux and vlm, one rank and TP 2 each, at once; logs: logs/image_*.log" >>"$STAGE_LOG"
  for model in flux vlm; do
    timeout -k 10 "$left" "$TITAN" train --job.config_file "configs/$model/debug_model.toml" \
      "${common[@]}" --job.dump_folder "$work/image_${model}_one" \
      >"$work/logs/image_${model}_one.log" 2>&1 &
    JOB_PIDS[${model}_one]=$!
    TITAN_SHARED_DEVICE=1 timeout -k 10 "$left" "$TITAN" run --nproc_per_node 2 -- train \
      --job.config_file "configs/$model/debug_model.toml" "${common[@]}" "${tp[@]}" \
      --job.dump_folder "$work/image_${model}_tp2" >"$work/logs/image_${model}_tp2.log" 2>&1 &
    JOB_PIDS[${model}_tp2]=$!
  done
  wait_jobs image flux_one flux_tp2 vlm_one vlm_tp2 || return
  NOTE="${DEVICE}, TP 2 vs 1 rank, max relative loss difference over 10 steps:"
  for model in flux vlm; do
    run_cmd "$PY" "$root/scripts/gpu_check_report.py" parity "$work/image_${model}_tp2/metrics.jsonl" \
      "$work/image_${model}_one/metrics.jsonl" --steps 10 --rtol "$RTOL" || rc=1
    tail -n 1 "$STAGE_LOG" >"$work/image_$model.json"
    NOTE+=" $model $(json_get "$work/image_$model.json" max_rel .2e)"
  done
  NOTE+=" (tolerance $RTOL)"
  return $rc
}

titan_speed() {  # titan_speed NAME OVERRIDES...: the speed run, figures in $work/NAME.json
  local name="$1"
  shift
  ensure_data || return
  titan_train "$name" "$DEVICE" configs/llama3/llama3_8b.toml --model.flavor "$FLAVOR" \
    --training.seq_len "$SEQ" --training.local_batch_size "$BATCH" \
    --training.steps $((WARMUP + STEPS)) --metrics.log_freq 1 --activation_checkpoint.mode none \
    --training.mixed_precision_param bfloat16 --lr_scheduler.warmup_steps 2 "$@" || return
  run_cmd "$PY" "$root/scripts/gpu_check_report.py" speed "$work/$name/metrics.jsonl" \
    --warmup "$WARMUP" --tokens-per-step $((BATCH * SEQ))
  local rc=$?
  tail -n 1 "$STAGE_LOG" >"$work/$name.json"
  local out="$work/$name.json"
  NOTE="$(json_get "$out" tokens_per_s ,.0f) tokens/s, $(json_get "$out" tflops .4g) TFLOP/s,"
  NOTE+=" MFU $(json_get "$out" mfu .1f)%,"
  NOTE+=" loss $(json_get "$out" loss_first .3f) -> $(json_get "$out" loss_last .3f)"
  return $rc
}

titan_bf16() { titan_speed titan_bf16; }

reference() {  # reference MODE: bench/torch_reference.py, figures in $work/ref_MODE.json
  local mode="$1" extra=()
  # Dry run: one thread, and torch.compile's graph capture without inductor's code generation
  # (minutes of C++ compilation on a small CPU; the GPU run compiles with inductor).
  ((dry_run)) && extra=(--threads 1 --compile-backend aot_eager)
  run_cmd "$PY" "$root/bench/torch_reference.py" --flavor "$FLAVOR" --device "$DEVICE" \
    --dtype bfloat16 --seq "$SEQ" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" \
    --mode "$mode" --json "$work/ref_$mode.json" "${extra[@]}" || return
  NOTE="$(json_get "$work/ref_$mode.json" tokens_per_s ,.0f) tokens/s,"
  NOTE+=" $(json_get "$work/ref_$mode.json" tflops .4g) TFLOP/s"
  [[ "$mode" == compile ]] && NOTE+=", compile $(json_get "$work/ref_$mode.json" compile_s .0f) s \
(backend $(json_get "$work/ref_$mode.json" compile_backend))"
  local titan_tps ref_tps
  titan_tps="$(json_get "$work/titan_bf16.json" tokens_per_s)"
  ref_tps="$(json_get "$work/ref_$mode.json" tokens_per_s)"
  if [[ "$titan_tps" != - && "$ref_tps" != - ]]; then
    NOTE+="; titan / PyTorch $mode = $(awk -v a="$titan_tps" -v b="$ref_tps" \
      'BEGIN { printf "%.2f", a / b }')"
  fi
  return 0
}

ref_eager() { reference eager; }
ref_compile() { reference compile; }

float8() {
  if ((dry_run)); then
    titan_speed titan_float8 --model.converters quantize.linear.float8 \
      --quantize.linear.float8.recipe_name tensorwise --quantize.linear.float8.emulate=true
    local rc=$?
    NOTE="emulated on the CPU (not a GPU figure): $NOTE"
    return $rc
  fi
  local major="${ENV_CAPABILITY%%.*}" minor="${ENV_CAPABILITY##*.}"
  if ((major * 10 + minor < 89)); then
    NOTE="skipped: compute capability ${ENV_CAPABILITY} (float8 matmuls need >= 8.9)"
    return 3
  fi
  titan_speed titan_float8 --model.converters quantize.linear.float8 \
    --quantize.linear.float8.recipe_name tensorwise
}

# ---- run ---------------------------------------------------------------------------------------

echo "[gpu_check] build folder $build_dir, work folder $work, budget ${BUDGET} s, ${JOBS} jobs"
stages_saved="$stages_arg"
stages_arg=""  # preflight always runs
stage preflight 60 preflight
stages_arg="$stages_saved"
if [[ "$(tail -n 1 "$work/stages.tsv" | cut -f2)" != ok ]]; then
  echo "gpu_check: $(tail -n 1 "$work/stages.tsv" | cut -f4)" >&2
  write_summary
  exit 2
fi
stage build 330 build
if ((configure_only)); then
  write_summary
  cat "$summary"
  exit "$FAILED"
fi
if [[ ! -x "$TITAN" ]] && ((needs_titan)); then
  echo "gpu_check: no $TITAN after the build stage; the stages that run it cannot run" >&2
  write_summary
  cat "$summary"
  exit 1
fi
# The CUDA unit tests first (a failure there explains later ones), then parity and the figures;
# ref_compile only with COMPILE_NEED seconds of the budget left (see the top of this file).
stage unit 90 unit
stage parity 90 parity
stage shared_parallel 90 shared_parallel
stage image_models 60 image_models
stage titan_bf16 120 titan_bf16
stage ref_eager 90 ref_eager
stage float8 120 float8
stage ref_compile 150 ref_compile "$COMPILE_NEED"

write_summary
echo
cat "$summary"
echo
echo "[gpu_check] summary: $summary; logs: $work/logs"
exit "$FAILED"
