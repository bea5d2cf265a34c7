#!/usr/bin/env bash
# Regenerates every bundled profile in profiles/aic/ from aiconfigurator-core's database.
#   pip install -r scripts/requirements-profile.txt   (or PYTHON=/path/to/venv/bin/python)
#   scripts/aic_profiles_all.sh            # all
#   scripts/aic_profiles_all.sh h100-      # only names containing "h100-"
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT=profiles/aic
filter="${1:-}"

# name | HF id | AIC system | backend | TP | extra args
PROFILES=(
  "h100-llama3.1-8b-vllm-tp1|meta-llama/Meta-Llama-3.1-8B|h100_sxm|vllm|1|"
  "h100-llama3.1-70b-vllm-tp4|meta-llama/Meta-Llama-3.1-70B|h100_sxm|vllm|4|"
  "h200-qwen3-32b-vllm-tp2|Qwen/Qwen3-32B|h200_sxm|vllm|2|"
  "b300-qwen3-32b-vllm-tp1|Qwen/Qwen3-32B|b300_sxm|vllm|1|"
  "b300-qwen3-32b-vllm-tp2|Qwen/Qwen3-32B|b300_sxm|vllm|2|"
  "b300-qwen3-32b-vllm-tp4|Qwen/Qwen3-32B|b300_sxm|vllm|4|"
  "b300-qwen3-32b-vllm-tp8|Qwen/Qwen3-32B|b300_sxm|vllm|8|"
  "h100-mixtral-8x7b-vllm-tp2|mistralai/Mixtral-8x7B-v0.1|h100_sxm|vllm|2|"
  "b200-deepseek-v3-vllm-tp8|deepseek-ai/DeepSeek-V3|b200_sxm|vllm|8|"
  "h200-qwen3-32b-sglang-tp2|Qwen/Qwen3-32B|h200_sxm|sglang|2|"
  "h100-llama3.1-8b-trtllm-tp1|meta-llama/Meta-Llama-3.1-8B|h100_sxm|trtllm|1|"
)

for row in "${PROFILES[@]}"; do
  IFS='|' read -r name model system backend tp extra <<<"$row"
  [[ -z "$filter" || "$name" == *"$filter"* ]] || continue
  # shellcheck disable=SC2086  # extra holds zero or more separate flags
  "$PYTHON" scripts/aic_profile.py --model "$model" --system "$system" --backend "$backend" \
    --tp "$tp" $extra --out "$OUT/$name.npz" 2>/dev/null
done
