#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with what scripts/gpu_check.sh needs on a lent GPU machine that has
# Python 3.12, PyTorch and CUDA but none of fedtune's other dependencies and no network: the
# versions of this checkout's .venv, as cp312 manylinux wheels (sdist-only ones built here).
# Run here, then carry .whl with the device call (about 45 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
mkdir -p .whl
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
pinned() { for name in "$@"; do echo "$name==$($PIP show "$name" | sed -n 's/^Version: //p')"; done; }
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  $(pinned pydantic pydantic_core annotated-types typing-inspection boto3 botocore s3transfer \
    jmespath cryptography cffi pycparser httpx2 httpcore2 truststore huggingface_hub \
    transformers peft accelerate hjson tokenizers safetensors nltk rapidfuzz absl-py six)
# Two platform tags can fetch two builds of one release (cryptography: manylinux_2_28 and
# _2_34), and pip refuses to install both: keep the older glibc's.
for project in $(ls .whl | cut -d- -f1 | sort | uniq -d); do
  ls .whl/"$project"-*.whl | sort | tail -n +2 | xargs rm -f
done
# training.kernels: liger (the `gpu` extra; not in the CPU .venv): pure Python (Triton
# kernels), needs torch>=2.1.2 and triton>=2.3.1, which the GPU machine has (torch 2.11 with
# triton 3.6); 0.8.5 patches transformers 5's Llama.
python3 -m pip download --quiet --no-deps --only-binary=:all: -d .whl "liger-kernel==0.8.5"
# Published as source only: built into pure-Python wheels here.
$PIP wheel --quiet --no-deps -w .whl $(pinned deepspeed rouge-score)
ls .whl
