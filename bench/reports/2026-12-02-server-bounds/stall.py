"""Does one client's hostile body stall the others? A real `specexec serve` (the embedded SmolLM2, its
default configuration) streams one chat while a second client sends a 10 MB message and a JSON body
nested 100,000 deep, and a third polls ``/health`` every 20 ms. The server is started with
``--max-body-bytes`` above 10 MB so the 10 MB body is read and parsed (at the default limit it is a
413 on its Content-Length, never read). Printed: each hostile answer, ``/health``'s latency while they
were sent, and the stream's inter-token gaps then against its median.

    python bench/reports/2026-12-02-server-bounds/stall.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not come up")


def stream_times(base: str, out: list[float], done: threading.Event) -> None:
    body = {
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": 600,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(time.monotonic())
    done.set()


def poll_health(base: str, out: list[tuple[float, float]], done: threading.Event) -> None:
    with httpx.Client(base_url=base, timeout=10) as http:
        while not done.is_set():
            began = time.monotonic()
            http.get("/health")
            out.append((began, time.monotonic() - began))
            time.sleep(0.02)


SENDER = """
import json, sys, time, httpx
base, size, which = sys.argv[1], int(sys.argv[2]), sys.argv[3]
big = json.dumps({"messages": [{"role": "user", "content": "a " * (size // 2)}], "max_tokens": 8}).encode()
deep = ('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()
sys.stdout.write("ready\\n"); sys.stdout.flush(); sys.stdin.readline()
with httpx.Client(base_url=base, timeout=120) as http:
    bodies = {"big": ("%.1f MB message" % (len(big) / 1e6), big), "deep": ("100,000-deep JSON", deep)}
    for name, raw in [bodies[w] for w in which.split(",")]:
        t0 = time.monotonic()
        answer = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        print("%s: %d in %.2f s" % (name, answer.status_code, time.monotonic() - t0), flush=True)
"""


def hostile(base: str, size: int, which: str) -> tuple[float, float, float, list[str]]:
    """Send the bodies from another process, niced (its own GIL and JSON work stay out of the measuring
    one), one after the other; (the sender's start, the window's start and end, what each got)."""
    spawned = time.monotonic()
    sender = subprocess.Popen(
        # at nice 19: on 2 cores the client's own work (sending 10 MB) would take a core from the
        # server's two torch threads; this measures what the server's handling costs the stream
        ["nice", "-n", "19", sys.executable, "-c", SENDER, base, str(size), which],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sender.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # (the sender's own start-up, which takes a core, is over before the window)
    began = time.monotonic()
    sender.stdin.write("go\n")
    sender.stdin.flush()
    answers = [sender.stdout.readline().strip() for _ in which.split(",")]
    ended = time.monotonic()
    sender.wait(60)
    return spawned, began, ended, answers


def one_round(base: str, size: int, which: str) -> dict:
    tokens: list[float] = []
    health: list[tuple[float, float]] = []
    done = threading.Event()
    streamer = threading.Thread(target=stream_times, args=(base, tokens, done))
    poller = threading.Thread(target=poll_health, args=(base, health, done))
    streamer.start()
    poller.start()
    while len(tokens) < 60:  # (the stream's own pace first)
        time.sleep(0.01)
    spawned, began, ended, answers = hostile(base, size, which)
    streamer.join()
    poller.join()
    gaps = [(a, b - a) for a, b in zip(tokens, tokens[1:])]  # (start, length)
    median_gap = statistics.median(g for _, g in gaps)
    during = [g for t, g in gaps if t + g >= began and t <= ended]  # (every gap the window overlaps)
    # the control: the same stream's gaps away from the sender (its start-up takes a core too)
    quiet = [g for t, g in gaps if t + g < spawned - 0.1 or t > ended + 0.1]
    health_during = [lat for t, lat in health if began <= t <= ended]
    return {
        "answers": answers,
        "window_s": ended - began,
        "health_max_ms": 1000 * max(health_during),
        "health_n": len(health_during),
        "gap_median_ms": 1000 * median_gap,
        "gap_max_during_ms": 1000 * max(during) if during else float("nan"),
        "gap_ratio": max(during) / median_gap if during else float("nan"),
        "gap_max_quiet_ms": 1000 * max(quiet),
        "gap_p99_ms": 1000 * sorted(g for _, g in gaps)[int(0.99 * len(gaps))],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=10_000_000, help="the large message's bytes")
    parser.add_argument("--send", default="big,deep", help="which bodies, in order: big, deep")
    parser.add_argument("--max-body-bytes", type=int, help="the server's limit (default: its own)")
    args = parser.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "specexec.cli", "serve", "--port", str(port)]
        + (["--max-body-bytes", str(args.max_body_bytes)] if args.max_body_bytes else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(base)
        for i in range(args.rounds):
            r = one_round(base, args.size, args.send)
            print(f"round {i + 1}: " + "; ".join(r["answers"]))
            print(
                f"  /health while they were sent ({r['window_s']:.2f} s, {r['health_n']} polls): "
                f"max {r['health_max_ms']:.1f} ms; stream gap median {r['gap_median_ms']:.1f} ms, "
                f"max meanwhile {r['gap_max_during_ms']:.1f} ms ({r['gap_ratio']:.2f}x); with nothing sent: "
                f"max {r['gap_max_quiet_ms']:.1f} ms, p99 of all {r['gap_p99_ms']:.1f} ms"
            )
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
