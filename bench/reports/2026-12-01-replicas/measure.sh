#!/usr/bin/env bash
# Two `specexec serve` replicas (one thread each, the default model) behind sglang-router, on loopback.
# Per policy (cache-aware, round robin): 8 three-turn conversations (conversations.py: the replica of
# each turn, the prefix cache's share of later turns), then `specexec bench --server` through the
# router on Spec-Bench at c=1 and 4; then the same bench against one replica directly.
# From the repository root (about 15 minutes): bash bench/reports/2026-12-01-replicas/measure.sh
set -euo pipefail
here=bench/reports/2026-12-01-replicas
out=${OUT:-$here}
ports=(18201 18202)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
for port in "${ports[@]}"; do
  OMP_NUM_THREADS=1 python -m specexec serve --port "$port" > "$out/replica-$port.log" 2>&1 &
  pids+=($!)
done
for port in "${ports[@]}"; do  # 503 "loading" until the model is up, then 200
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; do sleep 1; done
done
counters() {  # requests finished, prompt tokens looked up and found in the prefix cache, per replica
  for port in "${ports[@]}"; do
    curl -s "http://127.0.0.1:$port/metrics" | awk -v port="$port" '
      /^vllm:request_success_total/ {r += $NF} /^vllm:prefix_cache_queries_total/ {q = $NF}
      /^vllm:prefix_cache_hits_total/ {h = $NF}
      END {printf "replica %s: requests %d, prompt tokens %d, cached %d\n", port, r, q, h}'
  done
}
for policy in cache_aware round_robin; do
  for port in "${ports[@]}"; do curl -s -X POST "http://127.0.0.1:$port/flush_cache" > /dev/null; done
  echo "== before $policy" | tee -a "$out/counters.txt"; counters | tee -a "$out/counters.txt"
  python -m sglang_router.launch_router --host 127.0.0.1 --port 18200 --policy "$policy" \
    --worker-urls http://127.0.0.1:18201 http://127.0.0.1:18202 --log-level error \
    --prometheus-host 127.0.0.1 --prometheus-port 18299 > "$out/router-$policy.log" 2>&1 &
  router=$!
  until curl -sf http://127.0.0.1:18200/v1/models > /dev/null; do sleep 1; done
  python "$here/conversations.py" http://127.0.0.1:18200 http://127.0.0.1:18201 http://127.0.0.1:18202 \
    | tee "$out/conversations-$policy.txt"
  python -m specexec bench --server http://127.0.0.1:18200 --server-prompts text --dataset specbench --num-requests 16 \
    --max-tokens 64 --concurrency 1,4 --output "$out/specbench-$policy.json" | tee "$out/specbench-$policy.txt"
  kill "$router"; wait "$router" 2>/dev/null || true
  echo "== after $policy" | tee -a "$out/counters.txt"; counters | tee -a "$out/counters.txt"
done
python -m specexec bench --server http://127.0.0.1:18201 --server-prompts text --dataset specbench --num-requests 16 \
  --max-tokens 64 --concurrency 1,4 --output "$out/specbench-one-replica.json" | tee "$out/specbench-one-replica.txt"
