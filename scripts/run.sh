#!/usr/bin/env bash
# The main job: build libdsqwen and generate text.
#   scripts/run.sh                       bundled demo model (random weights, real
#                                        tokenizer: prints gibberish), CPU backend
#   scripts/run.sh MODEL_DIR ["prompt"]  a real checkpoint directory, e.g.
#                                        DeepSeek-R1-Distill-Qwen-1.5B (CUDA if a
#                                        GPU is present, else CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# NVIDIA's toolkit packages install nvcc in /usr/local/cuda/bin without
# putting it on PATH; CMake only finds nvcc on PATH (or via CUDACXX).
if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target dsqwen-cli
MODEL="${1:-}"
PROMPT="${2:-Explain in one paragraph why the sky is blue.}"
if [ -z "$MODEL" ]; then
  MODEL=build/demo-model
  # standard library only: works with whatever python3 is first on PATH
  [ -f "$MODEL/model.safetensors" ] || python3 scripts/make_demo_model.py "$MODEL"
  echo "(demo model: random weights with the real tokenizer; expect gibberish." \
       " Pass a real model directory for real text.)" >&2
  exec build/examples/dsqwen generate --model "$MODEL" --backend cpu --max-tokens 48 \
       --seed 1 "$PROMPT"
fi
exec build/examples/dsqwen generate --model "$MODEL" --max-tokens 512 "$PROMPT"
