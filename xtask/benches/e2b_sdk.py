"""The official E2B Python SDK's side of `cargo xtask bench e2b` (see `e2b.rs`): timed calls
against `sandbox serve`'s E2B API, in normal mode, printed as `samples <key> ms: v v ...`.

    python e2b_sdk.py sequential N   N times: Sandbox.create() then commands.run("true"), timed
                                     together (`create_first_cmd`) and the create alone
                                     (`create`); each sandbox killed after, untimed
    python e2b_sdk.py warm N         one sandbox, 3 warm-up runs, then N commands.run("true")
    python e2b_sdk.py concurrent N   N threads, released together, each timing its own
                                     Sandbox.create(); then all killed

Environment: E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL. Every sandbox made is killed, also
when a call fails.
"""

import sys
import threading
import time

from e2b import Sandbox

MADE = []
TIMEOUT = 300


def ms(start):
    return (time.perf_counter() - start) * 1000


def show(key, samples):
    print(f"samples {key} ms: " + " ".join(f"{s:.3f}" for s in samples), flush=True)


def ran_true(r):
    assert r.exit_code == 0 and r.stdout == "", r


def sequential(n):
    first, create = [], []
    for _ in range(n):
        start = time.perf_counter()
        sbx = Sandbox.create(timeout=TIMEOUT)
        created = ms(start)
        MADE.append(sbx.sandbox_id)
        ran_true(sbx.commands.run("true"))
        first.append(ms(start))
        create.append(created)
        assert sbx.kill() is True
        MADE.remove(sbx.sandbox_id)
    show("create_first_cmd", first)
    show("create", create)


def warm(n):
    sbx = Sandbox.create(timeout=TIMEOUT)
    MADE.append(sbx.sandbox_id)
    for _ in range(3):
        ran_true(sbx.commands.run("true"))
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        ran_true(sbx.commands.run("true"))
        samples.append(ms(start))
    show("warm_run_true", samples)


def concurrent(n):
    barrier = threading.Barrier(n)
    results = [None] * n
    lock = threading.Lock()

    def one(i):
        barrier.wait()
        start = time.perf_counter()
        try:
            sbx = Sandbox.create(timeout=TIMEOUT)
        except Exception as e:  # reported below, after every thread ended
            results[i] = e
            return
        results[i] = ms(start)
        with lock:
            MADE.append(sbx.sandbox_id)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = ms(wall)
    failed = [r for r in results if not isinstance(r, float)]
    assert not failed, f"{len(failed)} of {n} concurrent creates failed: {failed[0]!r}"
    show("concurrent_create", results)
    print(f"concurrent wall ms: {wall:.3f}", flush=True)


def main():
    mode, n = sys.argv[1], int(sys.argv[2])
    try:
        {"sequential": sequential, "warm": warm, "concurrent": concurrent}[mode](n)
    finally:
        for sandbox_id in list(MADE):
            try:
                Sandbox.kill(sandbox_id)
            except Exception as e:
                print(f"cleanup: kill {sandbox_id}: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
