#!/usr/bin/env bash
# The KVComm section of docs/RESULTS.md (issue 12): the paired tables on Countries and HotpotQA,
# then the section itself.
#
#   bash research/kvcomm_tables.sh     # about 1 h 45 min on a busy 2-core CPU; resumes where it stopped
#
# Runs go to runs/table-<dataset> (git-ignored). A run split over two processes with
# `research/kvcomm_table.py --skip N --out runs/table-<dataset>-b` (and -c) is read together with
# the main folder when those folders exist.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
TARGETS=receiver,skyline,text,kvcomm@0.3,kvcomm@0.5,kvcomm@0.7,kvcomm-random@0.3,kvcomm-contiguous@0.3

"$PY" research/kvcomm_table.py --dataset countries --limit 100 --threads 1 --only "$TARGETS,kvcomm-all,kvcomm-query@0.3" \
  --out runs/table-countries
"$PY" research/kvcomm_table.py --dataset hotpotqa --limit 100 --threads 1 --only "$TARGETS" --out runs/table-hotpotqa
"$PY" research/kvcomm_table.py --dataset hotpotqa --limit 40 --threads 1 --only kvcomm-all,kvcomm-query@0.3 \
  --out runs/table-hotpotqa

HOTPOT=runs/table-hotpotqa
for part in b c; do
  if [ -f "runs/table-hotpotqa-$part/rows.csv" ]; then HOTPOT="$HOTPOT+runs/table-hotpotqa-$part"; fi
done
"$PY" research/kvcomm_results.py \
  --table "Countries=runs/table-countries=python research/kvcomm_table.py --dataset countries --limit 100 --threads 1 --only $TARGETS,kvcomm-all,kvcomm-query@0.3 --out runs/table-countries" \
  --table "HotpotQA=$HOTPOT=python research/kvcomm_table.py --dataset hotpotqa --limit 100 --threads 1 --only $TARGETS --out runs/table-hotpotqa (controls: --limit 40 --only kvcomm-all,kvcomm-query@0.3)" \
  --write docs/RESULTS.md
