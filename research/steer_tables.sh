#!/usr/bin/env bash
# The latent relay and KV steering rows of docs/RESULTS.md (issue 23): Countries and HotpotQA,
# n = 100, paired with the KVComm table (the bench calibrates KVComm on the task's first sample and
# leaves it out, as research/kvcomm_table.py does, so the same 100 samples are scored).
#
#   bash research/steer_tables.sh      # hours on a busy 2-core CPU; resumes where it stopped
#
# Per dataset, two bench invocations into one folder (runs/steer-<dataset>, git-ignored):
#   1. receiver, Skyline, KVComm with every layer (kvcomm@1), the latent relay at N = 0, 2, 4, 8,
#      and KV steering with both built-in pair sets at c_v = 4 and 8;
#   2. the latent relay's three controls at N = 2, 4, 8 (at N = 0 they are the method or the receiver).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
for dataset in ${STEER_DATASETS:-countries hotpotqa}; do
  out="runs/steer-$dataset"
  "$PY" -m kvviz bench --pair embedded --dataset "$dataset" --limit 100 --threads 1 --quiet \
    --handoffs receiver,skyline,kvcomm,latent_relay,kv_steering --ratios 1 --strategies kvcomm \
    --latent-steps 0,2,4,8 --latent-controls off \
    --steering-pairs answer_briefly,use_the_context --steering-values 4,8 --out "$out"
  "$PY" -m kvviz bench --pair embedded --dataset "$dataset" --limit 100 --threads 1 --quiet \
    --handoffs kvcomm,latent_relay --ratios 1 --strategies kvcomm \
    --latent-steps 2,4,8 --latent-controls no_transfer,identity_map,random_map --out "$out"
done
"$PY" research/steer_results.py --table Countries=runs/steer-countries --table HotpotQA=runs/steer-hotpotqa \
  --write docs/RESULTS.md
