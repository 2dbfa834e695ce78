#!/usr/bin/env bash
# The "inserted contradiction" section of docs/RESULTS.md (issue 43): every handoff family on its
# contradicted notes (bench --contradict), on Countries and HotpotQA, n = 100 each (the samples with a
# contradiction: 97 of Countries' first 100, 87 of HotpotQA's).
#
#   bash research/contradiction_tables.sh      # hours on a busy 2-core CPU; resumes where it stopped
#
# Per dataset (runs/contra-<dataset> and runs/contra-gemma-<dataset>, git-ignored):
#   1. the embedded pair: receiver, Skyline, text, C2C and its control, KVComm at r = 0.5 and its control,
#      AC, the latent relay (N = 4), KV steering (use the context), the C2C translation and its control;
#   2. embedded-gemma (Gemma-3-270M to itself): CIPHER needs the receiver's tokenizer; the same receiver
#      reads the same samples, so its rows join the embedded pair's table (paired with its Skyline and receiver).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
OUT="${KVVIZ_CONTENT_DIR:-runs}"
EMBEDDED=receiver,skyline,text,c2c,c2c_control,kvcomm,kvcomm_control,ac,latent_relay,kv_steering,c2c_translate,c2c_translate_control
for dataset in countries hotpotqa; do
  "$PY" -m kvviz bench --pair embedded --dataset "$dataset" --contradict --limit 100 --threads 1 --quiet --max-new-tokens 12 \
    --handoffs "$EMBEDDED" --ratios 0.5 --latent-steps 4 --steering-pairs use_the_context --out "$OUT/contra-$dataset"
  "$PY" -m kvviz bench --pair embedded-gemma --dataset "$dataset" --contradict --limit 100 --threads 1 --quiet --max-new-tokens 12 \
    --handoffs cipher --out "$OUT/contra-gemma-$dataset"
done
args=()
for dataset in countries hotpotqa; do
  args+=(--table "$dataset=$OUT/contra-$dataset" --table "$dataset=$OUT/contra-gemma-$dataset")
done
"$PY" research/contradiction_results.py "${args[@]}" --write docs/RESULTS.md
