#!/bin/bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# One forward (decode row, 4-row verify) with the final code against the code before this part, taking
# turns three times (the host drifts by up to 30% within minutes). About 6 minutes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
before=$(mktemp -d)/specexec && mkdir -p "$before" && git archive fa66346 | tar -x -C "$before"
steps=bench/reports/2026-11-27-int8-tiles/step_cost.py
for turn in 1 2 3; do
  echo "# before, turn $turn" >> "$here/step_cost_turns.txt"
  PYTHONPATH=$(dirname "$before") python $steps --settings bfloat16:auto --context 300,1300 2>&1 | grep -E "^bfloat16:auto +[0-9]" >> "$here/step_cost_turns.txt"
  echo "# after, turn $turn" >> "$here/step_cost_turns.txt"
  python $steps --settings bfloat16:auto --context 300,1300 2>&1 | grep -E "^bfloat16:auto +[0-9]" >> "$here/step_cost_turns.txt"
done
