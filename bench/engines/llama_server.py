"""``specexec bench --baseline llama-server``: llama.cpp's own server, started by the bench, driven with the
``--server`` client on the same prompts, then stopped.

The binary is ``--llama-server PATH``, else ``$LLAMA_SERVER``, else ``llama-server`` on the PATH
(docs/benchmarking.md says how to build it here). It serves the same GGUF file on loopback with the
bench's threads, one slot per request in flight (``--parallel`` = the largest concurrency) and a context
of that many times the longest request. Each ``--llama-server-args`` string (repeatable, e.g.
``"--spec-type ngram-mod"``) is one more server and one more row, ``llama-server`` plus the arguments.

llama-server's requests differ from vLLM's in two fields: it takes no ``stop_token_ids`` nor
``min_tokens``, and ends a request at its end-of-generation tokens (the GGUF's EOS, end-of-turn and
end-of-message: the bench's stop set for a GGUF), so ``--ignore-eos`` becomes its ``ignore_eos``, which
sets those tokens' logits to -inf: none can be sampled, as in every other engine of the bench.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

#: how long the server may take to load the model and answer /health
START_TIMEOUT_S = 120.0
#: per slot, on top of the longest prompt and max tokens (llama-server splits its context among slots)
CONTEXT_SLACK = 64


def find_llama_server(path: str | None) -> Path:
    """The llama-server binary: ``path``, else $LLAMA_SERVER, else the PATH's; a ValueError saying how to
    get one where there is none."""
    chosen = path or os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if chosen is None:
        raise ValueError(
            "--baseline llama-server: no llama-server binary (give --llama-server PATH or set LLAMA_SERVER; "
            "docs/benchmarking.md says how to build it from the llama-cpp-python sdist's llama.cpp)"
        )
    binary = Path(chosen).expanduser()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise ValueError(f"--baseline llama-server: {binary} is not an executable file")
    return binary


def row_name(extra_args: str) -> str:
    """The row of a server started with ``extra_args``: ``llama-server`` or ``llama-server <args>``."""
    return " ".join(["llama-server", *shlex.split(extra_args)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server process on loopback for the length of a ``with`` block: its URL in ``url``; its
    log kept in a temporary file, whose end a start that fails quotes."""

    def __init__(
        self, binary: Path, gguf: Path, *, threads: int, slots: int, slot_context: int, extra_args: str = ""
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
            "-t", str(threads), "-tb", str(threads), "--parallel", str(slots),
            "-c", str(slots * (slot_context + CONTEXT_SLACK)), "--metrics",
            *shlex.split(extra_args),
        ]  # fmt: skip
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        self._log = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 (closed by __exit__)
        self._process = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_until_healthy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._log.close()

    def _wait_until_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ValueError(  # (its arguments or its binary: what the user gave)
                    f"llama-server exited with code {self._process.returncode} before it served:\n"
                    f"{' '.join(self.argv)}\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # (not listening yet, or still loading)
            time.sleep(0.2)
        raise RuntimeError(
            f"llama-server did not answer /health within {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}"
        )

    def exit_note(self) -> str | None:
        """None while the server runs; once it has exited, its code and its log's end."""
        if self._process is None or self._process.poll() is None:
            return None
        return f"llama-server exited with code {self._process.returncode}:\n{self.log_tail()}"

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        self._log.seek(0)
        return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])
