#!/usr/bin/env bash
# Train the shipped C2C fuser for the embedded pair (sharer SmolLM2-135M -> receiver Gemma-3-270M),
# with the record's context private to the sharer, and its control (same data, steps and seed; the sharer's KV replaced by zeros), side by side,
# one CPU thread each, then copy both into assets/fusers/ (float16, about 9 MB each).
#
#   bash scripts/train_embedded_fusers.sh [OUT_DIR]
#
# Measured on the 2-core development machine (shared with other jobs): see docs/C2C.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/embedded-fusers}"
DEST="assets/fusers/smollm2-135m__gemma3-270m"
# --context private: the Dolly record's input (context) is read by the sharer only, the receiver
# reads the instruction alone; --context-only keeps records that have an input.
ARGS=(--pair embedded --data dolly --context private --context-only --steps 200 --batch-size 1
      --lr 1e-3 --width 96 --seed 0 --heldout 80 --max-prompt-tokens 64 --max-sharer-tokens 256
      --max-response-tokens 32 --save-every 50 --fp16 --threads 1 --device cpu --out "$OUT")
mkdir -p "$OUT"
start=$(date +%s)
python -m kvviz train-fuser "${ARGS[@]}" --no-progress > "$OUT/train_c2c.log" 2>&1 &
c2c_pid=$!
python -m kvviz train-fuser "${ARGS[@]}" --control --no-progress > "$OUT/train_control.log" 2>&1 &
control_pid=$!
wait "$c2c_pid"
wait "$control_pid"
echo "trained both fusers in $(( $(date +%s) - start )) s" | tee "$OUT/wall_time.txt"
mkdir -p "$DEST"
rm -rf "$DEST/c2c" "$DEST/control"
cp -r "$OUT/c2c" "$OUT/control" "$DEST/"
cp "$OUT/loss_c2c.csv" "$OUT/loss_control.csv" "$OUT/summary_c2c.json" "$OUT/summary_control.json" "$DEST/"
echo "shipped to $DEST:"; du -sh "$DEST"/*
