#!/usr/bin/env bash
# Regenerate docs/RESULTS.md: the embedded pair's accuracy on four datasets and the perf table.
#
#   bash scripts/make_results.sh            # about 40 minutes on a busy 2-core CPU machine
#
# Runs go to runs/results/<dataset> (git-ignored). A run that is interrupted resumes where it
# stopped when the script is started again, and an existing runs/results/perf/perf.json is
# reused: delete runs/results (or one folder in it) to measure again. Environment:
#   KVVIZ_RESULTS_DIR  where the runs go (default runs/results)
#   KVVIZ_THREADS      torch CPU threads (default 1: much faster than 2 on a busy shared machine)
#   KVVIZ_PERF_REPEATS repeats of each perf measurement (default 2)
#   KVVIZ_LIMIT        samples for HotpotQA, ARC-Challenge and OpenBookQA (default 10; Countries: 40)
#   KVVIZ_SKIP_PERF=1  leave the perf measurement out (e.g. while it runs in another terminal)
#   KVVIZ_HANDOFFS     the handoffs to run (default all: every registered handoff)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
OUT="${KVVIZ_RESULTS_DIR:-runs/results}"
THREADS="${KVVIZ_THREADS:-1}"
REPEATS="${KVVIZ_PERF_REPEATS:-2}"
LIMIT="${KVVIZ_LIMIT:-10}"
HANDOFFS="${KVVIZ_HANDOFFS:-all}"
COMMON=(--pair embedded --handoffs "$HANDOFFS" --ratios 0.3,0.5,0.7 --strategies kvcomm,contiguous,random
        --seed 0 --threads "$THREADS" --quiet)

"$PY" -m kvviz bench "${COMMON[@]}" --dataset countries --limit 40 --out "$OUT/countries"
"$PY" -m kvviz bench "${COMMON[@]}" --dataset hotpotqa --limit "$LIMIT" --out "$OUT/hotpotqa"
"$PY" -m kvviz bench "${COMMON[@]}" --dataset arc_challenge --limit "$LIMIT" --out "$OUT/arc_challenge"
"$PY" -m kvviz bench "${COMMON[@]}" --dataset openbookqa --dataset-option with_fact=true --limit "$LIMIT" --out "$OUT/openbookqa"
if [ -n "${KVVIZ_SKIP_PERF:-}" ]; then
  echo "KVVIZ_SKIP_PERF set: perf left out"; exit 0
fi
if [ ! -f "$OUT/perf/perf.json" ]; then
  "$PY" -m kvviz bench --perf --pair embedded --repeats "$REPEATS" --threads "$THREADS" --quiet --out "$OUT/perf" > /dev/null
fi

"$PY" -c "
from kvviz.studies.bench.report import write_results_markdown
write_results_markdown('docs/RESULTS.md', [
    'Countries=$OUT/countries', 'HotpotQA=$OUT/hotpotqa', 'ARC-Challenge=$OUT/arc_challenge',
    'OpenBookQA+fact=$OUT/openbookqa'], '$OUT/perf', 'bash scripts/make_results.sh')
"
echo "wrote docs/RESULTS.md"
