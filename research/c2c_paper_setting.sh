#!/usr/bin/env bash
# C2C in the paper's own setting (docs/C2C.md, section 5): both models read the same prompt, the
# loss is the receiver's cross-entropy on the response. Trains, on the same Dolly records with the
# same steps, width and seed: the C2C fuser of the embedded pair (SmolLM2-135M -> Gemma-3-270M),
# its control (the sharer's KV replaced by zeros) and a Gemma -> Gemma self-fusion fuser; then
# scores ARC-Challenge, OpenBookQA and MMLU-Redux (200 seeded questions each) by the likelihood
# of each choice and prints the table.
#
#   bash research/c2c_paper_setting.sh [OUT_DIR] [train|eval|table ...]   (default: all three)
#
# Two processes at a time, one CPU thread each; training resumes from its checkpoints
# (--save-every 50 --resume), so a stage can be rerun after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/c2c-paper}"
shift || true
if [ $# -gt 0 ]; then STAGES=("$@"); else STAGES=(train eval table); fi
mkdir -p "$OUT/shared_c2c" "$OUT/shared_self"

TRAIN=(--data dolly --context shared --steps 500 --batch-size 2 --width 256 --seed 0 --heldout 64 --measure 64
       --save-every 50 --resume --threads 1 --device cpu --no-progress)
MC=(--mc-scoring likelihood --datasets arc_challenge,openbookqa,mmlu_redux --mc-limit 200 --seed 0 --heldout 0
    --max-new-tokens 1 --message-tokens 64 --threads 1 --device cpu --json)

train_c2c()     { nice -n 10 python -m kvviz train-fuser --pair embedded "${TRAIN[@]}" --out "$OUT/shared_c2c" > "$OUT/shared_c2c/train_c2c.log" 2>&1; }
train_control() { nice -n 10 python -m kvviz train-fuser --pair embedded "${TRAIN[@]}" --control --out "$OUT/shared_c2c" > "$OUT/shared_c2c/train_control.log" 2>&1; }
train_self()    { nice -n 10 python -m kvviz train-fuser --pair embedded-gemma "${TRAIN[@]}" --out "$OUT/shared_self" > "$OUT/shared_self/train_c2c.log" 2>&1; }
# the receiver, the sharer, text, C2C and C2C with another question in the sharer; then the control
# and the self-fusion fuser (each with its other-question row)
eval_c2c()      { nice -n 10 python -m kvviz eval-fuser --pair embedded --fuser "$OUT/shared_c2c/c2c" "${MC[@]}" \
                    --handoffs receiver,sharer,text,c2c --out "$OUT/eval_c2c.json" > "$OUT/eval_c2c.log" 2>&1; }
eval_control()  { nice -n 10 python -m kvviz eval-fuser --pair embedded --fuser "$OUT/shared_c2c/c2c" "${MC[@]}" \
                    --handoffs c2c_control --out "$OUT/eval_control.json" > "$OUT/eval_control.log" 2>&1; }
eval_self()     { nice -n 10 python -m kvviz eval-fuser --pair embedded-gemma --fuser "$OUT/shared_self/c2c" "${MC[@]}" \
                    --handoffs c2c --out "$OUT/eval_self.json" > "$OUT/eval_self.log" 2>&1; }

for stage in "${STAGES[@]}"; do
  case "$stage" in
    train)
      train_c2c & a=$!; train_self & b=$!; wait "$a" "$b"
      train_control ;;
    eval)
      eval_c2c & a=$!; eval_self & b=$!; wait "$a" "$b"
      eval_control ;;
    table)
      python research/c2c_paper_table.py --c2c "$OUT/eval_c2c.json" "$OUT/eval_control.json" \
        --self-fusion "$OUT/eval_self.json" | tee "$OUT/table.md" ;;
    *) echo "unknown stage $stage (train, eval or table)" >&2; exit 2 ;;
  esac
done
