#!/usr/bin/env bash
# The GPU checks of issue 13 in one command, for a lent GPU machine (see docs/benchmarks.md,
# "Reproducing on a GPU"): the machine has PyTorch and CUDA but not fedtune's other
# dependencies, which travel as cp312 wheels in .whl/ (git-ignored).
#   OUT=/some/dir FEDTUNE_SOURCE_COMMIT=$(git rev-parse --short HEAD) scripts/gpu_check.sh [SECTION...]
# SECTIONS: speed tests jobs steps accel (default all, in that order; on an H100 `speed steps` took
# 200 s and `speed tests` 216 s on the second lease, so all four fit one 10-minute call).
# .whl/ comes from scripts/gpu_wheels.sh. Writes under $OUT: gpu.txt (device, versions, a
# bf16 matmul ceiling), the client-step MFU vs a bare PEFT loop (JSON), steps-memory JSON
# (peak memory per step kind on CUDA, ZeRO-3 rows; the rows so far in
# step-memory.partial.json if cut off), pytest.log (precision, rank launcher and DeepSpeed
# tests on the GPU), jobs.log (example jobs with device cuda, bf16) and their summaries.
set -u
OUT=${OUT:?set OUT to a folder for the results}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD
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

