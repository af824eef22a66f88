#!/usr/bin/env bash
# Two `specexec serve` replicas started at the same moment behind sglang-router (started first, as a
# router in front of replicas that are loading sees them), on an empty cache and then on the cache they
# filled: the seconds until each /health answers 200, and the invalid-request warnings in their logs.
set -uo pipefail
out="$(dirname "$0")"
cache="$(mktemp -d)"
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
run_once() {
  local label=$1 p1 p2 pr pids=() t0
  p1=$(free_port); p2=$(free_port); pr=$(free_port)
  python -m sglang_router.launch_router --host 127.0.0.1 --port "$pr" --worker-urls "http://127.0.0.1:$p1" \
    "http://127.0.0.1:$p2" --policy cache_aware --health-check-interval-secs 1 --worker-startup-check-interval 1 \
    --prometheus-host 127.0.0.1 --prometheus-port "$(free_port)" > "/tmp/router-$label.log" 2>&1 &
  local router=$!
  t0=$(date +%s.%N)
  for p in "$p1" "$p2"; do
    SPECEXEC_CACHE_DIR="$cache" specexec serve --port "$p" > "/tmp/replica-$label-$p.log" 2>&1 &
    pids+=($!)
  done
  for p in "$p1" "$p2"; do
    until curl -sf "http://127.0.0.1:$p/health" > /dev/null; do
      sleep 0.2
      if (( $(echo "$(date +%s.%N) - $t0 > 300" | bc) )); then echo "$label: replica $p not healthy in 300 s"; break; fi
    done
    printf '%s: replica on %s healthy after %.1f s\n' "$label" "$p" "$(echo "$(date +%s.%N) - $t0" | bc)"
  done
  sleep 3  # the router's next checks
  printf '%s: invalid-request warnings in the replicas'"'"' logs: %s\n' "$label" \
    "$(cat /tmp/replica-$label-*.log | grep -c 'Invalid HTTP request')"
  curl -s "http://127.0.0.1:$pr/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"SmolLM2-135M-Instruct","messages":[{"role":"user","content":"Say hi."}],"max_tokens":8}' \
    | python -c 'import json,sys; print("'"$label"': through the router:", json.load(sys.stdin)["choices"][0]["message"]["content"][:40])'
  kill "${pids[@]}" "$router"; wait 2>/dev/null
}
run_once cold
run_once warm
rm -rf "$cache"
