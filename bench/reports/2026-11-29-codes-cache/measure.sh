#!/usr/bin/env bash
# The report scripts this runs left the tree (issue 71): their READMEs' Scripts sections name the commits that hold them.
# The gguf scheme's load before (commit cf7ec62: the dense float32 conversion cache, gguf-py's reader) and
# after (the codes cache, the header-only tensor index), each in fresh processes, taking turns.
# Usage: bash measure.sh [OUT_FOLDER]; needs the files of ../2026-11-29-random-0.5b/make_files.sh in /opt/gguf.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
repo=$(git -C "$here" rev-parse --show-toplevel)
old=/tmp/codes-cache-before
[ -d "$old" ] || git -C "$repo" worktree add -f "$old" cf7ec62 >/dev/null
mkdir -p /tmp/codes-cache-pkg && ln -sfn "$old" /tmp/codes-cache-pkg/specexec
files=("$(python -c 'from specexec.executor.model.model_loader import default_model_path as p; print(p())')"
       /opt/gguf/random-llama-0.5b-q4_k_m.gguf)
lscpu | grep -E "Model name|Flags" > "$out/cpu.txt"
# each tree its own cache folder: torch rebuilds a C++ extension whose include paths changed, so two
# trees sharing one kernel build would rebuild it at every turn; built once here, before any timing
before=(env PYTHONPATH=/tmp/codes-cache-pkg SPECEXEC_CACHE_DIR=/tmp/codes-cache-home-before)
after=(env SPECEXEC_CACHE_DIR=/tmp/codes-cache-home-after)
for tree in before after; do
  declare -n run=$tree
  "${run[@]}" python -c "from specexec.executor.layers.cpu_kernels import cpu_kernels; assert cpu_kernels()"
done
: > "$out/loads.jsonl"
for file in "${files[@]}"; do
  rm -rf /tmp/codes-cache-dir-before /tmp/codes-cache-dir-after
  for round in 1 2 3 4; do  # round 1 converts; 2-4 read the cache
    for tree in before after; do
      declare -n run=$tree
      echo "{\"tree\": \"$tree\", \"round\": $round}" >> "$out/loads.jsonl"
      "${run[@]}" python "$here/load_once.py" "$file" "/tmp/codes-cache-dir-$tree" 2>/dev/null >> "$out/loads.jsonl"
    done
  done
done
cat "$out/loads.jsonl"
