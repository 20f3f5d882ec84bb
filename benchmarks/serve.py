"""Benchmark: tokens/s through ``mlxops serve``'s forwarded port against mlx-lm's server
reached directly, the same server, model and prompts, in the same run.

On its own one-node sandbox (needs root): the bundled trainer makes a model (``--dims``,
``--layers``; one training step: the weights' values do not change the speed), a ``serve:``
job exports and serves it with ``bind: 0.0.0.0``, so that this machine reaches the server
both ways:

- direct: ``http://<node1's address>:PORT/v1``, over the sandbox bridge;
- forwarded: ``mlxops serve JOB`` (the CLI, in a subprocess) and its
  ``http://127.0.0.1:LOCAL/v1``, over mlxops's SSH connection to node1 (a direct-tcpip
  channel to the node's loopback).

The official ``openai`` client, the same for both, sends each prompt in turn (greedy,
``--max-tokens`` tokens: a byte-level model without an end token always gives them all),
as a whole completion and as a streamed chat completion, alternating direct and forwarded
per request. tokens/s = completion tokens / the request's wall time; the table gives the
median per path and mode, forwarded / direct of the medians, and the median of the ratios
of requests sent one right after the other (less sensitive to a machine whose load
changes during the run) (target >= 0.95).

    sudo .venv/bin/python benchmarks/serve.py [--rounds 5] [--max-tokens 64]
                                              [--dims 256] [--layers 4]

Every process it starts is stopped by pid, the job stopped and the sandbox taken down,
also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai
import yaml

from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.stop import stop_job
from mlxops.jobs.watch import supervise
from mlxops.node.protocol import FINISHED
from mlxops.sandbox import Sandbox, netns, prerequisites
from mlxops.sandbox.python import add_package
from mlxops.transport import Connector

PROMPTS = ["The cat sat on", "Once upon a time", "import numpy as np\n", "Dear Sir,"]
PORT = 8190


def job_file(work: Path, box: Sandbox, name: str, **body) -> Path:
    path = work / f"{name}.yml"
    path.write_text(yaml.safe_dump({"name": name, "inventory": str(box.inventory_path),
                                    "hosts": "node1", **body}))
    return path


def wait_answering(client: openai.OpenAI, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.completions.create(model="default_model", prompt="a", max_tokens=1)
            return
        except (openai.APIConnectionError, openai.APIStatusError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def one_request(client: openai.OpenAI, mode: str, prompt: str, max_tokens: int) -> float:
    """tokens/s of one greedy request."""
    start = time.perf_counter()
    if mode == "completion":
        answer = client.completions.create(model="default_model", prompt=prompt,
                                           temperature=0, max_tokens=max_tokens)
        tokens = answer.usage.completion_tokens
    else:
        stream = client.chat.completions.create(
            model="default_model", messages=[{"role": "user", "content": prompt}],
            temperature=0, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True})
        tokens = 0
        for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    seconds = time.perf_counter() - start
    assert tokens == max_tokens, tokens
    return tokens / seconds


def measure(opts: argparse.Namespace, clients: dict[str, openai.OpenAI]
            ) -> dict[tuple[str, str], list[float]]:
    got: dict[tuple[str, str], list[float]] = {}
    order = list(clients)
    for n in range(opts.rounds):
        for mode in ("completion", "streaming"):
            for prompt in PROMPTS:
                order.reverse()  # alternate which path goes first
                for path in order:
                    rate = one_request(clients[path], mode, prompt, opts.max_tokens)
                    got.setdefault((path, mode), []).append(rate)
        print(f"round {n + 1}/{opts.rounds} done", file=sys.stderr)
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dims", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--subnet", default=None)
    opts = p.parse_args()
    why = prerequisites()
    if why:
        print(f"needs: {why}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="mlxops-bench-serve-", dir="/var/tmp"))
    work.chmod(0o755)
    os.environ["MLXOPS_HOME"] = str(work / "controller")
    pid = os.getpid()
    box = Sandbox(work / "sandbox", prefix=f"mxbs{pid % 100000}",
                  subnet=opts.subnet or netns.free_subnet(range(245, 250), pid))
    forward: subprocess.Popen | None = None
    connector = Connector()
    try:
        box.up(1)
        inventory = yaml.safe_load(box.inventory_path.read_text())
        add_package(inventory["all"]["vars"]["mlxops_python"], "mlx-lm==0.32.2", "mlx_lm")
        model = {"dims": opts.dims, "layers": opts.layers, "heads": max(1, opts.dims // 64),
                 "vocab_size": 256, "seq_len": 64}
        train = load_job(job_file(work, box, "bench-model", trainer={
            "model": model, "data": {"source": "synthetic"},
            "train": {"steps": 1, "global_batch": 1, "micro_batch": 1,
                      "checkpoint_every": 1, "consistency_every": 0}}))
        assert supervise(launch(train, connector), connector).state == FINISHED
        serve = load_job(job_file(work, box, "bench-serve", serve={
            "model": {"job": "bench-model"}, "port": PORT, "bind": "0.0.0.0",
            "max_tokens": opts.max_tokens}))
        launch(serve, connector)
        forward = subprocess.Popen([sys.executable, "-m", "mlxops", "serve", "bench-serve"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True, stdin=subprocess.DEVNULL)
        url = forward.stdout.readline().strip()
        clients = {
            "direct": openai.OpenAI(base_url=f"http://{box.ip('node1')}:{PORT}/v1",
                                    api_key="unused", max_retries=0, timeout=120),
            "forwarded": openai.OpenAI(base_url=url, api_key="unused", max_retries=0,
                                       timeout=120),
        }
        for client in clients.values():
            wait_answering(client)
        for client in clients.values():  # warm: the first requests compile kernels
            for prompt in PROMPTS:
                one_request(client, "completion", prompt, opts.max_tokens)
        got = measure(opts, clients)
    finally:
        if forward is not None:
            forward.terminate()  # SIGINT may be ignored (a background job's)
            forward.wait(timeout=10)
        try:
            stop_job(load_record("bench-serve"), connector)
        except Exception as exc:  # noqa: BLE001 - cleanup goes on
            print(f"stop: {exc}", file=sys.stderr)
        connector.close()
        box.down()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmodel dims {opts.dims}, {opts.layers} layers, vocab 256; {opts.max_tokens} "
          f"tokens a request, {len(PROMPTS)} prompts x {opts.rounds} rounds per row")
    print(f"{'mode':<12} {'direct tok/s':>13} {'forwarded tok/s':>16} {'forwarded/direct':>17}"
          f" {'paired':>7}")
    for mode in ("completion", "streaming"):
        direct, forwarded = got[("direct", mode)], got[("forwarded", mode)]
        paired = statistics.median(f / d for f, d in zip(forwarded, direct, strict=True))
        print(f"{mode:<12} {statistics.median(direct):>13.1f} "
              f"{statistics.median(forwarded):>16.1f} "
              f"{statistics.median(forwarded) / statistics.median(direct):>17.3f} {paired:>7.3f}")
    print("paired: the median of forwarded/direct over requests sent one right after the "
          f"other; load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
