#!/usr/bin/env bash
# Fetch, here, the wheels of the pure-Python and manylinux packages folio needs that the GPU
# image lacks (the device tool's KINDS.md lists what it has); they travel to the GPU machine in
# .whl/ (carry [".whl"]), and scripts/gpu_session.sh installs them into /tmp/site.
# Versions follow this venv's, for CPython 3.12 on x86_64 (the GPU image's Python).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
pkgs="annotated-types apache-tvm-ffi compressed-tensors fastapi httptools jiter jsonschema
jsonschema-specifications llguidance openai partial-json-parser pydantic pydantic-core referencing
rpds-py sniffio starlette typing-inspection uvicorn xgrammar httpx2 httpcore2 opentelemetry-api loguru truststore"
pins=()
for p in $pkgs; do
  v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$p'))" 2>/dev/null) || continue
  pins+=("$p==$v")
done
rm -rf .whl && mkdir .whl
plat=()
for n in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}"
du -sh .whl
