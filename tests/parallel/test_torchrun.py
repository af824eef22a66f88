"""Tensor parallelism with the ranks torchrun starts (``tensor_parallel_launch: torchrun``), tested on one
machine with torchrun itself (``python -m torch.distributed.run``) on loopback: `specexec run` started
on every rank gives the one-process text (rank 1 reading its shard layer by layer); a Python program on
rank 0 whose other rank is killed gets every request failed naming the rank, and later ones refused,
without a hang; a rank whose rank 0 is killed exits; a rank that never comes fails the start-up in time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from factories import free_port
from specexec import Executor, ExecutorConfig
from tiny_models import make_tiny_model, make_tiny_tokenizer

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    _, model = make_tiny_model("llama")
    model.save_pretrained(path)
    make_tiny_tokenizer().save_pretrained(path)
    return path


def torchrun(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    command = [*TORCHRUN, "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def specexec_run(model_dir: Path, *extra: str, verbose: bool = False) -> list[str]:
    return [
        "-m", "specexec", *(["-v"] if verbose else []), "run", "--raw", "--prompt", "w1 w2 w3 w4 w5 w1 w2 w3", "--model", str(model_dir),
        "--dtype", "float64", "--max-tokens", "12", "--decoding-type", "NGram", "--no-warmup", *extra,
    ]  # fmt: skip


def test_specexec_run_under_torchrun_gives_the_one_process_text(model_dir):
    one = subprocess.run(
        [sys.executable, *specexec_run(model_dir)], capture_output=True, text=True, timeout=120
    )
    assert one.returncode == 0, one.stderr
    two = torchrun(
        ["--no-python", sys.executable, *specexec_run(model_dir, "--tensor-parallel-size", "2",
         "--tensor-parallel-launch", "torchrun", verbose=True)]
    )  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 1 read its shard layer by layer" in two.stderr, "rank 1 never held the whole model"
    text = one.stdout.strip().splitlines()[0]
    assert text and two.stdout.count(text) == 1, (one.stdout, two.stdout)  # rank 0 prints, rank 1 does not


FRONT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from specexec import Executor, ExecutorConfig, Request, SamplingParams
    from specexec.executor.torchrun_worker import is_worker_rank, run_worker

    model_dir, pid_file, out_file, mode = sys.argv[1:]
    config = ExecutorConfig(
        model=model_dir, dtype="float64", device="cpu", num_kv_blocks=64, block_size=4, max_num_tokens=32,
        tensor_parallel_size=2, tensor_parallel_launch="torchrun", tensor_parallel_timeout_s=30,
    )
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    if is_worker_rank(config):
        open(pid_file, "w").write(str(os.getpid()))
        try:
            run_worker(config)
        except RuntimeError:
            sys.exit(3)  # killed under it: the front is not expected to be well
    else:
        executor = Executor(config=config)
        first = executor.run([Request([1, 2, 3, 4], params)])
        if mode == "kill-rank-0":
            os.kill(os.getpid(), signal.SIGKILL)
        os.kill(int(open(pid_file).read()), signal.SIGKILL)
        start = time.monotonic()
        failed = executor.run([Request([5, 6, 7], params), Request([8, 9], params)])
        later = executor.run([Request([1, 2], params)])
        executor.close()
        json.dump({
            "first": [o.error for o in first], "failed": [o.error for o in failed],
            "later": [o.error for o in later], "seconds": time.monotonic() - start,
            "pages_free": executor.block_manager.num_free_blocks,
        }, open(out_file, "w"))
    """
)


def start_by_hand(model_dir: Path, tmp_path: Path, mode: str) -> tuple[list[subprocess.Popen], Path]:
    """The two ranks started by hand with torchrun's variables (rank 0 then hosts the job's store;
    under torchrun its agent does, and stops the whole job when one rank dies)."""
    script = tmp_path / "front.py"
    script.write_text(FRONT)
    out = tmp_path / "out.json"
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    args = [sys.executable, str(script), str(model_dir), str(tmp_path / "pid"), str(out), mode]
    popen = [
        subprocess.Popen(args, env={**env, "RANK": str(r)}, stderr=subprocess.PIPE, text=True) for r in (0, 1)
    ]
    return popen, out


def test_a_killed_rank_fails_the_requests_and_later_ones_without_a_hang(model_dir, tmp_path):
    ranks, out = start_by_hand(model_dir, tmp_path, "kill-rank-1")
    try:
        front_err = ranks[0].communicate(timeout=240)[1]
    finally:
        for rank in ranks:
            rank.kill()
            rank.communicate()
    assert out.exists(), front_err[-3000:]
    result = json.loads(out.read_text())
    assert result["first"] == [None]
    named = "tensor-parallel rank 1 stopped (no heartbeat)"
    assert len(result["failed"]) == 2 and all(e and named in e for e in result["failed"]), result
    assert result["later"][0] and named in result["later"][0], "later requests are refused with the cause"
    assert result["seconds"] < 30, "the closed connection is seen at once, not at the timeout"
    assert result["pages_free"] == 64


def test_a_rank_whose_rank_0_is_killed_exits(model_dir, tmp_path):
    ranks, _ = start_by_hand(model_dir, tmp_path, "kill-rank-0")
    try:
        assert ranks[0].wait(240) == -9
        assert ranks[1].wait(30) == 3, "rank 1 saw rank 0's connection close and left"
    finally:
        for rank in ranks:
            rank.kill()
            rank.communicate()


def test_torchrun_launch_is_refused_without_torchrun_or_with_a_module(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    config = dict(device="cpu", tensor_parallel_size=2, tensor_parallel_launch="torchrun")
    with pytest.raises(ValueError, match="needs torchrun's environment .RANK, WORLD_SIZE"):
        Executor(None, ExecutorConfig(**config))
    _, model = make_tiny_model("llama")
    with pytest.raises(ValueError, match="every rank loads the model from its path"):
        Executor(model, ExecutorConfig(**config))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(ValueError, match="this process is torchrun's rank 1: .*run_worker"):
        Executor(None, ExecutorConfig(**config))
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="tensor_parallel_size is 2, but torchrun started 3 ranks"):
        Executor(None, ExecutorConfig(**config))
    with pytest.raises(ValueError, match="tensor_parallel_launch"):
        ExecutorConfig(tensor_parallel_launch="ssh")


def test_a_rank_that_never_comes_fails_the_start_up_within_the_timeout(monkeypatch, model_dir):
    import time

    import torch.distributed as dist
    from specexec.executor.parallel.tp_runner import TensorParallelError

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    config = ExecutorConfig(
        model=str(model_dir), dtype="float64", device="cpu", tensor_parallel_size=2,
        tensor_parallel_launch="torchrun", tensor_parallel_timeout_s=2,
    )  # fmt: skip
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match="during joining the job"):
        Executor(config=config)
    assert time.monotonic() - start < 30
    assert not dist.is_initialized(), "nothing half-joined stays"
