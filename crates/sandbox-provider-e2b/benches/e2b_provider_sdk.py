"""The official E2B Python SDK's side of `cargo xtask bench e2b-provider` (see
`e2b_provider.rs`): timed calls on a sandbox the bench made, through `sandbox serve`'s E2B API
in normal mode, printed as `samples <key> ms: v v ...`.

    python e2b_provider_sdk.py exec N ID    N commands.run("true") (`exec_true`)
    python e2b_provider_sdk.py files N ID   N files.write of 1 MiB then files.read(format="bytes")
                                            (`file_1mib`), the bytes checked after the clock

Each connects to sandbox ID first and warms up with 3 untimed calls. The sandbox is the
bench's: it is never killed here.

Environment: E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL.
"""

import os
import sys
import time

from e2b import Sandbox

WARMUP = 3
# Longer than the whole run, so the connect never shortens the sandbox's life.
TIMEOUT = 3600
PATH = "/tmp/bench-sdk-1mib.bin"


def ms(start):
    return (time.perf_counter() - start) * 1000


def show(key, samples):
    print(f"samples {key} ms: " + " ".join(f"{s:.3f}" for s in samples), flush=True)


def run_true(sbx):
    r = sbx.commands.run("true")
    assert r.exit_code == 0 and r.stdout == "", r


def exec_true(sbx, n):
    for _ in range(WARMUP):
        run_true(sbx)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        run_true(sbx)
        samples.append(ms(start))
    show("exec_true", samples)


def file_1mib(sbx, n):
    data = os.urandom(1024 * 1024)

    def round_trip():
        sbx.files.write(PATH, data)
        return sbx.files.read(PATH, format="bytes")

    for _ in range(WARMUP):
        assert bytes(round_trip()) == data
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        read = round_trip()
        samples.append(ms(start))
        assert bytes(read) == data, f"read {len(read)} bytes, not the {len(data)} written"
    show("file_1mib", samples)


def main():
    mode, n, sandbox_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sbx = Sandbox.connect(sandbox_id, timeout=TIMEOUT)
    {"exec": exec_true, "files": file_1mib}[mode](sbx, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
