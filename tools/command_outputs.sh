#!/usr/bin/env bash
# Every command's output on one checkpoint, into one folder, so that a refactoring can be shown to
# change nothing a user sees: run it before and after, then `diff -r BEFORE AFTER` (it strips what differs
# from run to run: timings, progress bars, the folder's name).
#   tools/command_outputs.sh CKPT OUT
# Under a minute on 2 CPU cores for the demo model.
set -euo pipefail
ckpt=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
run() { local name=$1; shift; "$@" >"$out/$name.txt" 2>&1 || { echo "$name failed: see $out/$name.txt"; exit 1; }; }
common=(--ckpt "$ckpt" --device cpu)
run eval vit-eval "${common[@]}" --out "$out/eval"
run cls vit-attention "${common[@]}" --num_images 4 --out "$out/cls" --plots
run query vit-attention "${common[@]}" --num_images 4 --method query --query_patch 2,3 --out "$out/query"
run rollout vit-attention "${common[@]}" --num_images 4 --method rollout --head_fusion max --discard_ratio 0.5 --out "$out/rollout"
run grad-rollout vit-attention "${common[@]}" --num_images 4 --method grad-rollout --target 1 --out "$out/grad-rollout"
run input-gradient vit-attention "${common[@]}" --num_images 4 --method input-gradient --out "$out/input-gradient"
run score vit-attention score "${common[@]}" --num_images 16 --out "$out/score"
run heads vit-attention heads "${common[@]}" --num_images 16 --out "$out/heads"
run patch vit-attention patch "${common[@]}" --num_images 16 --out "$out/patch"
run page vit-attention "${common[@]}" --num_images 4 --html "$out/page/attention.html" \
  --heads "$out/heads/heads.json" --scores "$out/score/scores.json"
# what differs from run to run: timings, progress bars, the output folder's name
find "$out" -name '*.txt' -exec sed -i -E -e '/batch\/s\]/d' -e "s|$out|OUT|g" \
  -e 's/[0-9]+(\.[0-9]+)? ?(s|ms)\b/<time>/g' {} +
find "$out" -name '*.json' -exec sed -i -E 's/"seconds": [0-9.]+/"seconds": null/' {} +
echo "outputs in $out: $(find "$out" -type f | wc -l) files"
