#!/usr/bin/env bash
# The knowing sharer and its C2C fusers (issue 44; docs/C2C.md, "A sharer that knows"):
#   1. two LoRA adapters of SmolLM2-135M-Instruct: one taught the handbook (kvviz.data.handbook),
#      one taught it with the values permuted (the sharer that learned the opposite);
#   2. a C2C fuser for the knower pair (SmolLM2 + handbook -> Gemma-3-270M) on the fuser-train
#      entities, and its control (the same, without the sharer's KV);
#   3. the shipped copies: assets/adapters/smollm2-135m/{handbook,handbook-permuted} and
#      assets/fusers/smollm2-135m@handbook__gemma3-270m/{c2c,control} (float16).
#
#   bash scripts/train_knower.sh [OUT_DIR] [DEVICE]
#
# Every step trains in legs of at most 55 minutes (--minutes 55) and resumes where the last leg
# stopped: run this script again until it says "shipped". Each leg's time is in OUT_DIR/*/legs*.jsonl
# (docs/C2C.md lists them). DEVICE: cpu (default; one thread per job, two jobs side by side) or cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/knower}"
DEVICE="${2:-cpu}"
THREADS=(--threads 1)
[ "$DEVICE" = "cpu" ] || THREADS=()
mkdir -p "$OUT/logs"

SHARER=(--epochs 5 --lr 2e-3 --rank 8 --dtype bfloat16 --minutes 55 --check-every-leg 30 --no-progress --device "$DEVICE" "${THREADS[@]}")
FUSER=(--data handbook --steps 2400 --batch-size 1 --heldout 120 --measure 60 --rope aware --token-alignment natural
       --fuse-template --max-prompt-tokens 64 --max-response-tokens 8 --width 96 --seed 0 --fp16 --save-every 100
       --resume --minutes 55 --no-progress --device "$DEVICE" "${THREADS[@]}" --out "$OUT/fusers")

leg() {  # leg NAME COMMAND...: one leg of a job, logged; a finished job is skipped
  local name=$1; shift
  if [ -e "$OUT/.done-$name" ]; then return 0; fi
  local log="$OUT/logs/$name-$(date +%Y%m%d-%H%M%S).log"
  if "$@" > "$log" 2>&1; then
    case $name in
      sharer-*) [ -d "$OUT/$name/adapter" ] && touch "$OUT/.done-$name" ;;
      fuser-*) [ -f "$OUT/fusers/summary_${name#fuser-}.json" ] && touch "$OUT/.done-$name" ;;
    esac
  else
    echo "$name failed: see $log" >&2; return 1
  fi
}

# 1. the two sharers, side by side
leg sharer-handbook python -m kvviz train-sharer --out "$OUT/sharer-handbook" "${SHARER[@]}" &
leg sharer-permuted python -m kvviz train-sharer --out "$OUT/sharer-permuted" --permuted --counterpart handbook "${SHARER[@]}" &
wait
[ -e "$OUT/.done-sharer-handbook" ] && [ -e "$OUT/.done-sharer-permuted" ] || { echo "sharers: a leg ended; run again"; exit 0; }
mkdir -p assets/adapters/smollm2-135m
for name in handbook handbook-permuted; do
  src="$OUT/sharer-${name#handbook-}"  # sharer-handbook, sharer-permuted
  rm -rf "assets/adapters/smollm2-135m/$name" && cp -r "$src/adapter" "assets/adapters/smollm2-135m/$name"
done

# 2. the fuser and its control, side by side (the control never reads the sharer)
leg fuser-c2c python -m kvviz train-fuser --pair knower "${FUSER[@]}" &
leg fuser-control python -m kvviz train-fuser --pair knower --control "${FUSER[@]}" &
wait
[ -e "$OUT/.done-fuser-c2c" ] && [ -e "$OUT/.done-fuser-control" ] || { echo "fusers: a leg ended; run again"; exit 0; }
DEST="assets/fusers/smollm2-135m@handbook__gemma3-270m"
mkdir -p "$DEST" && rm -rf "$DEST/c2c" "$DEST/control"
cp -r "$OUT/fusers/c2c" "$OUT/fusers/control" "$DEST/"
echo "shipped:"; du -sh assets/adapters/smollm2-135m/* "$DEST"/*
