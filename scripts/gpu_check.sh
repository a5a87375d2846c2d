#!/usr/bin/env bash
# The GPU checks of issue 13 in one command, for a lent GPU machine (see docs/benchmarks.md,
# "Reproducing on a GPU"): the machine has PyTorch and CUDA but not fedtune's other
# dependencies, which travel as cp312 wheels in .whl/ (git-ignored).
#   OUT=/some/dir FEDTUNE_SOURCE_COMMIT=$(git rev-parse --short HEAD) scripts/gpu_check.sh [SECTION...]
# SECTIONS: speed tests jobs steps accel (default all, in that order; on an H100 `speed steps` took
# 200 s and `speed tests` 216 s on the second lease, so all four fit one 10-minute call), and,
# only when named: speed33 (the client-step variants plain, liger, compile, compile+liger at the
# 1b shape and the 7b shape, in about SPEED33_BUDGET=330 s from the start) and pretrain (the
# benchmark's bases; PRETRAIN_STEPS and PRETRAIN_TIMEOUT override).
# .whl/ comes from scripts/gpu_wheels.sh. Writes under $OUT: gpu.txt (device, versions, a
# bf16 matmul ceiling), the client-step MFU vs a bare PEFT loop (JSON), steps-memory JSON
# (peak memory per step kind on CUDA, ZeRO-3 rows; the rows so far in
# step-memory.partial.json if cut off), pytest.log (precision, rank launcher and DeepSpeed
# tests on the GPU), jobs.log (example jobs with device cuda, bf16) and their summaries.
set -u
OUT=${OUT:?set OUT to a folder for the results}
if [ -d .whl ]; then
  SITE=${SITE:-/tmp/site}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || exit 1
  export PYTHONPATH=$SITE:$PWD/src:$PWD
else
  export PYTHONPATH=$PWD/src:$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SPEED_TIMEOUT=${SPEED_TIMEOUT:-240}
STEPS_TIMEOUT=${STEPS_TIMEOUT:-540}
SECTIONS=" ${*:-speed tests jobs steps accel} "
want() { [[ "$SECTIONS" == *" $1 "* ]]; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 - <<'PY'
import time, torch, transformers, peft, deepspeed
print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__,
      "peft", peft.__version__, "deepspeed", deepspeed.__version__)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(10):
    a @ b
torch.cuda.synchronize()
print(f"bf16 8192^3 matmul: {10 * 2 * 8192**3 / (time.perf_counter() - start) / 1e12:.0f} TFLOP/s (measured ceiling)")
PY
} 2>&1 | tee "$OUT/gpu.txt"

if want speed; then
# The client step's MFU first (two cells, the speed pairs and the compiled reference: about
# 90 s on an H100, a minute of it compiling), so a lease cut short still has it.
echo "== client-step speed and MFU vs a bare PEFT loop (bf16)"
timeout "$SPEED_TIMEOUT" python3 -m fedtune.cli.main bench system --out /tmp/bench-speed \
  --parts steps-memory --steps-devices cuda --steps-kinds client --steps-precisions bf16 \
  --record "$OUT/steps-memory-1b-gpu-speed-system.json" > "$OUT/speed.log" 2>&1
echo "speed exit $?"; grep -E "steps memory|fedtune / bare|client step" "$OUT/speed.log"
fi

if want speed33; then
# The client step in each variant against the bare eager PEFT loop (one fresh process
# per variant, rows saved as they end), cheap variants first (then compile+liger, the likeliest
# to reach the goal, before compile): the 1b rows with 10 steps and 2
# pairs (a compile variant's first run compiles: the bare loop's took 61 s on an H100), then
# the 7b shape (13.5 GB of bf16 weights per model, built on the GPU; batch 4 x 1024, no
# checkpointing; both loops' models and one step's activations, an estimated 60-75 GB: an
# H200's 141 GB; on an 80 GB H100 set SPEED33_7B_BATCH=2), with compile+liger
# only where 200 s are left. Each command gets a share of SPEED33_BUDGET (seconds from the
# script's start) as its speed_budget_s: a variant is cut at what is left (an error row) and
# those after it are recorded as skipped, so the record is always written; `timeout` (which
# kills its whole process group) is only the backstop.
# CPU dry run: SPEED33_DEVICES=cpu SPEED33_1B=tiny SPEED33_7B=tiny SPEED33_SIZES="--steps-set
# speed_batch_size=2 --steps-set speed_seq_len=32 --steps-set speed_steps=2"
echo "== client-step variants (1b) and the 7b shape"
BUDGET=${SPEED33_BUDGET:-330}
speed33() {  # SHAPE VARIANTS RECORD SECONDS [--steps-set ...]
  local shape=$1 variants=$2 record=$3 limit=$4
  shift 4
  if [ "$limit" -lt 40 ]; then echo "$shape $variants: skipped, ${limit} s left"; return; fi
  COLUMNS=250 timeout $((limit + 10)) python3 -m fedtune.cli.main bench system \
    --out "/tmp/bench33-$shape" --parts steps-memory --steps-devices "${SPEED33_DEVICES:-cuda}" \
    --steps-kinds client --steps-precisions bf16 --steps-shape "$shape" \
    --steps-variants "$variants" --steps-set memory_cells=false \
    --steps-set speed_compiled_bare=false --steps-set speed_budget_s=$((limit - 20)) \
    "$@" ${SPEED33_SIZES:-} --record "$OUT/$record" > "$OUT/${record%.json}.log" 2>&1
  echo "$shape $variants exit $? at ${SECONDS} s"
  grep -E "^client speed" "$OUT/${record%.json}.log"
  [ -f "$OUT/$record" ] || cp "/tmp/bench33-$shape/system/step-memory.partial.json" \
    "$OUT/${record%.json}.partial.json" 2>/dev/null
}
left() { echo $(( BUDGET - SECONDS - $1 )); }
speed33 "${SPEED33_1B:-1b}" plain,liger,compile+liger,compile \
  steps-memory-1b-gpu-accel-system.json "$(left 95)" \
  --steps-set speed_steps=10 --steps-set speed_reps=2
VARIANTS7=plain,liger
[ "$(left 0)" -ge 200 ] && VARIANTS7=plain,liger,compile+liger
speed33 "${SPEED33_7B:-7b}" "$VARIANTS7" steps-memory-7b-gpu-system.json "$(left 0)" \
  --steps-set speed_batch_size="${SPEED33_7B_BATCH:-4}" --steps-set speed_seq_len=1024 --steps-set speed_steps=4 \
  --steps-set speed_reps=2
fi

if want steps; then
echo "== every step kind on CUDA + ZeRO-3 server memory (rows saved as they come)"
timeout "$STEPS_TIMEOUT" python3 -m fedtune.cli.main bench system --out /tmp/bench \
  --parts memory,steps-memory --steps-devices cuda \
  --record "$OUT/steps-memory-1b-gpu-system.json" > "$OUT/steps.log" 2>&1
echo "steps-memory exit $?"; grep -E "steps memory|server memory" "$OUT/steps.log"
cp /tmp/bench/system/step-memory.partial.json "$OUT/" 2>/dev/null
fi

if want tests; then
echo "== tests on the GPU"
timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/unit/training/test_precision.py tests/unit/core/test_ranks_launcher.py \
  tests/unit/fedbiot/test_fedbiot_deepspeed.py > "$OUT/pytest.log" 2>&1
echo "pytest exit $?"; tail -15 "$OUT/pytest.log"
fi

if want accel; then
# training.compile (inductor) and training.kernels: liger against the plain path on CUDA
# (liger-kernel only where its wheel is in .whl/; otherwise those cases are skipped).
echo "== compile and Liger kernels on the GPU"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs \
  tests/unit/training/test_acceleration.py > "$OUT/accel.log" 2>&1
echo "accel exit $?"; tail -8 "$OUT/accel.log"
fi

if want jobs; then
echo "== example jobs, device cuda, bf16"
for path in $(python3 scripts/gpu_jobs.py bf16); do
  job=$(basename "$path" -cuda-bf16.yaml)
  SECONDS=0
  timeout "${JOB_TIMEOUT:-90}" python3 -m fedtune.cli.main run "examples/$job-cuda-bf16.yaml" --fresh --no-progress \
    --summary-json "$OUT/$job-cuda-bf16.json" >> "$OUT/jobs.log" 2>&1
  echo "$job exit $? in $SECONDS s"
done | tee -a "$OUT/jobs.log"
fi


if want pretrain; then
# Issue 30: the candidates for the default preset's large (benchmarks/bases.py) on the GPU in
# one go. Tiny models are launch-bound, so each runs as its own process, all at once. The
# small and FedMKT's SLMs are committed for this corpus (benchmarks/bases/) and stay; set
# PRETRAIN_SMALLS=1 to pretrain them here too (bases-default.tar). Each is cut at
# PRETRAIN_TIMEOUT s (a cut one returns nothing); the section ends within ~330 s.
# Returns (at most 8 files, each <= 16 MB): pretrain.log and base-<candidate>.tar per large
# candidate, each member a folder NAME/ to untar into benchmarks/bases/ (as "large", with
# the winner named in presets.py).
echo "== pretrain the benchmark's bases on CUDA (issue 30)"
PRETRAIN_TIMEOUT=${PRETRAIN_TIMEOUT:-300}
steps=${PRETRAIN_STEPS:+--steps $PRETRAIN_STEPS}
pretrain_one() {  # PRESET NAME: its own workspace, its own log
  SECONDS=0
  COLUMNS=200 timeout "$PRETRAIN_TIMEOUT" python3 -m fedtune.cli.main bench pretrain --preset "$1" \
    --models "$2" --out "/tmp/pretrain/$2" --force $steps > "/tmp/pretrain/$2.log" 2>&1
  echo "$2 exit $? in $SECONDS s" >> "/tmp/pretrain/$2.log"
  # A run cut by the timeout leaves its progress: how far it got, and how fast.
  python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print("cut at step", p["step"], "of", p["steps"], "after", round(p["seconds"]), "s of training")' \
    "/tmp/pretrain/$2/models/$2/fedtune_pretrain.progress.json" >> "/tmp/pretrain/$2.log" 2>/dev/null
}
rm -rf /tmp/pretrain && mkdir -p /tmp/pretrain
for name in large-h192l6 large-h160l8 large-h192l6-5k; do pretrain_one large-candidates "$name" & done
smalls_wanted=""
[ "${PRETRAIN_SMALLS:-0}" = 1 ] && smalls_wanted="small slm-gpt2-bpe slm-llama-wordpiece slm-gpt2-spbpe"
for name in $smalls_wanted; do pretrain_one default "$name" & done
wait
for log in /tmp/pretrain/*.log; do echo "--- $(basename "$log" .log)"; cat "$log"; done > "$OUT/pretrain.log"
grep -E -A1 " exit |test EM|parameters, |cut at|Error" "$OUT/pretrain.log"
for name in large-h192l6 large-h160l8 large-h192l6-5k; do
  [ -f "/tmp/pretrain/$name/models/$name/fedtune_pretrain.json" ] &&
    tar -C "/tmp/pretrain/$name/models" -cf "$OUT/base-$name.tar" "$name"
done
smalls="" && rm -rf /tmp/pretrain-pack && mkdir -p /tmp/pretrain-pack
for name in $smalls_wanted; do
  [ -f "/tmp/pretrain/$name/models/$name/fedtune_pretrain.json" ] &&
    cp -r "/tmp/pretrain/$name/models/$name" /tmp/pretrain-pack/ && smalls="$smalls $name"
done
[ -n "$smalls" ] && tar -C /tmp/pretrain-pack -cf "$OUT/bases-default.tar" $smalls
ls -l "$OUT"
fi
