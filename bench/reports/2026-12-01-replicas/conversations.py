"""8 conversations of 3 turns, one request at a time, through a router in front of replicas: which
replica served each turn (by its vllm:request_success_total) and the share of turns 2-3's prompt
tokens found in its prefix cache. Usage: python conversations.py ROUTER_URL REPLICA_URL..."""

from __future__ import annotations

import sys

import httpx
from prometheus_client.parser import text_string_to_metric_families

TURNS = ["Tell me about cats.", "And dogs?", "Which is friendlier?"]


def counters(url: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if family.name in ("vllm:request_success", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
            out[family.name.removeprefix("vllm:")] = sum(s.value for s in family.samples)
    return out


def main(router: str, replicas: list[str]) -> None:
    paths, queries, hits = [], 0.0, 0.0
    with httpx.Client(base_url=router, timeout=120) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]  # (sglang-router sends "unknown" without one)
        for c in range(8):
            messages, path = [], []
            for t, turn in enumerate(TURNS):
                messages.append({"role": "user", "content": f"Conversation {c}. {turn}"})
                before = [counters(r) for r in replicas]
                body = {"model": model, "messages": messages, "max_tokens": 48, "temperature": 0}
                answer = http.post("/v1/chat/completions", json=body).json()
                messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
                after = [counters(r) for r in replicas]
                (i,) = [
                    i
                    for i, (b, a) in enumerate(zip(before, after))
                    if a["request_success"] > b["request_success"]
                ]
                path.append(i)
                if t:
                    queries += after[i]["prefix_cache_queries"] - before[i]["prefix_cache_queries"]
                    hits += after[i]["prefix_cache_hits"] - before[i]["prefix_cache_hits"]
            paths.append(path)
    per_replica = [sum(p.count(i) for p in paths) for i in range(len(replicas))]
    kept = sum(len(set(p)) == 1 for p in paths)
    print(f"turns per replica: {per_replica}; conversations kept on one replica: {kept}/8")
    print(
        f"turns 2-3: {hits:.0f} of {queries:.0f} prompt tokens from the prefix cache ({hits / queries:.0%})"
    )
    print(f"replica of each turn: {paths}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
