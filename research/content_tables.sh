#!/usr/bin/env bash
# The "content or prompt?" section of docs/RESULTS.md (issue 30): every handoff family on its
# swapped notes (bench --swap), on Countries, recall and HotpotQA, n = 100 each (HotpotQA: the
# questions whose gold answer is in a supporting sentence, 91 of its first 100).
#
#   bash research/content_tables.sh      # about 2.5 hours on a busy 2-core CPU; resumes where it stopped
#
# Per dataset, two bench runs (runs/content-<dataset> and runs/content-gemma-<dataset>, git-ignored):
#   1. the embedded pair: receiver, Skyline, text, C2C and its control, KVComm at r = 0.3 and 0.5 and
#      its control, AC, the latent relay (N = 4), KV steering (use the context), the C2C translation
#      and its control;
#   2. embedded-gemma (Gemma-3-270M to itself): CIPHER needs the receiver's tokenizer, with receiver,
#      Skyline, text and KVComm r = 0.5 beside it on the same samples.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
OUT="${KVVIZ_CONTENT_DIR:-runs}"
EMBEDDED=receiver,skyline,text,c2c,c2c_control,kvcomm,kvcomm_control,ac,latent_relay,kv_steering,c2c_translate,c2c_translate_control
for dataset in ${CONTENT_DATASETS:-countries recall hotpotqa}; do
  "$PY" -m kvviz bench --pair embedded --dataset "$dataset" --swap --limit 100 --threads 1 --quiet \
    --handoffs "$EMBEDDED" --ratios 0.3,0.5 --latent-steps 4 --steering-pairs use_the_context \
    --out "$OUT/content-$dataset"
  "$PY" -m kvviz bench --pair embedded-gemma --dataset "$dataset" --swap --limit 100 --threads 1 --quiet \
    --handoffs receiver,skyline,cipher,text,kvcomm,kvcomm_control --ratios 0.5 --out "$OUT/content-gemma-$dataset"
done
args=()
for dataset in ${CONTENT_DATASETS:-countries recall hotpotqa}; do
  args+=(--table "$dataset=$OUT/content-$dataset" --table "$dataset=$OUT/content-gemma-$dataset")
done
"$PY" research/content_results.py "${args[@]}" --write docs/RESULTS.md
