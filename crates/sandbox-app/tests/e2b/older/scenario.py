"""An older official E2B Python SDK (PyPI `e2b` 2.45.1, this directory's hashed lock) in normal
mode against `sandbox serve`'s E2B API: create, run, read, kill.

2.45.1 creates through the legacy `POST /sandboxes` and connects through the legacy
`POST /sandboxes/{id}/connect`; the scenario counts the SDK's own calls of both routes, so a lock
that resolved to an SDK creating elsewhere fails here. Environment as for `../scenario.py`:
`E2B_API_KEY`, `E2B_API_URL` and `E2B_SANDBOX_URL` (both the E2B listener). Each step asserts the
SDK's result; a failed step is reported and the others still run (all but the first, which
makes the sandbox they use); every sandbox made is killed at the end. The last line is
`scenario: N passed, M failed`.
"""

import hashlib
import importlib.metadata
import os
import sys
import time
import uuid

from e2b import (
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    Sandbox,
    SandboxNotFoundException,
    SandboxQuery,
)
from e2b.api.client.api.sandboxes import post_sandboxes, post_sandboxes_sandbox_id_connect

SDK_VERSION = "2.45.1"
USER = "user"
HOME = f"/home/{USER}"
RUN = uuid.uuid4().hex[:8]
WORK = f"{HOME}/older-scenario-{RUN}"
METADATA = {"scenario-older": RUN}
MADE = []

# The SDK's legacy routes, counted where the SDK calls them (its API module's function).
CALLS = {"create": [], "connect": []}


def counting(name, module):
    inner = module.sync_detailed

    def call(*args, **kwargs):
        res = inner(*args, **kwargs)
        CALLS[name].append(res.status_code)
        return res

    module.sync_detailed = call


counting("create", post_sandboxes)
counting("connect", post_sandboxes_sandbox_id_connect)


class Ctx:
    sbx = None


def raises(kind, fn, what):
    try:
        got = fn()
    except kind as e:
        return e
    except Exception as e:
        raise AssertionError(f"{what}: raised {type(e).__name__}: {e}, want {kind.__name__}") from e
    raise AssertionError(f"{what}: returned {got!r}, want {kind.__name__}")


STEPS = []


def step(fn):
    STEPS.append(fn)
    return fn


class _Body:
    """What `_get_kwargs` serialises: only its route is looked at."""

    def to_dict(self):
        return {}


def create_through_the_legacy_route(ctx):
    assert importlib.metadata.version("e2b") == SDK_VERSION, importlib.metadata.version("e2b")
    assert post_sandboxes._get_kwargs(body=_Body())["url"] == "/sandboxes"
    ctx.sbx = Sandbox.create(template="base", metadata=METADATA, envs={"SCENARIO_ENV": "older"}, timeout=300)
    MADE.append(ctx.sbx.sandbox_id)
    assert CALLS["create"] == [201], f"the SDK's legacy create calls: {CALLS['create']}"
    info = ctx.sbx.get_info()
    assert info.metadata == METADATA, info.metadata
    assert info.template_id == "base", info.template_id
    ctx.sbx.files.make_dir(WORK)


@step
def commands_run_with_exit_codes(ctx):
    r = ctx.sbx.commands.run('echo out-$((6*7)); echo err >&2; printf "%s\\n" "$SCENARIO_ENV"; id -un; pwd')
    assert r.exit_code == 0, r
    assert r.stdout == f"out-42\nolder\n{USER}\n{HOME}\n", repr(r.stdout)
    assert r.stderr == "err\n", repr(r.stderr)
    e = raises(CommandExitException, lambda: ctx.sbx.commands.run("echo before; exit 5"), "a command exiting 5")
    assert e.exit_code == 5, e.exit_code
    assert e.stdout == "before\n", repr(e.stdout)


@step
def files_write_and_read(ctx):
    files = ctx.sbx.files
    files.write(f"{WORK}/hello.txt", "hello from 2.45.1")
    assert files.read(f"{WORK}/hello.txt") == "hello from 2.45.1"
    data = bytes(range(256)) + os.urandom(256 * 1024)
    files.write(f"{WORK}/bytes.bin", data)
    r = ctx.sbx.commands.run(f"sha256sum {WORK}/bytes.bin")
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest(), "the sandbox's copy differs"
    got = bytes(files.read(f"{WORK}/bytes.bin", format="bytes"))
    assert got == data, f"{len(got)} bytes back, {len(data)} written"
    names = sorted(e.name for e in files.list(WORK))
    assert names == ["bytes.bin", "hello.txt"], names
    raises(FileNotFoundException, lambda: files.read(f"{WORK}/no-such-file"), "reading a missing file")


@step
def connect_through_the_legacy_route(ctx):
    again = Sandbox.connect(ctx.sbx.sandbox_id)
    assert CALLS["connect"] and CALLS["connect"][-1] in (200, 201), f"the SDK's legacy connect calls: {CALLS['connect']}"
    assert again.files.read(f"{WORK}/hello.txt") == "hello from 2.45.1"


@step
def list_and_wrong_key(ctx):
    items = Sandbox.list(query=SandboxQuery(metadata=METADATA)).next_items()
    assert [i.sandbox_id for i in items] == [ctx.sbx.sandbox_id], items
    wrong = "e2b_" + uuid.uuid4().hex
    raises(AuthenticationException, lambda: Sandbox.create(api_key=wrong, timeout=60), "create with a wrong key")


@step
def kill_then_not_found(ctx):
    sandbox_id = ctx.sbx.sandbox_id
    assert ctx.sbx.kill() is True
    assert Sandbox.kill(sandbox_id) is False, "a second kill reported success"
    raises(SandboxNotFoundException, lambda: Sandbox.get_info(sandbox_id), "get_info after kill")
    raises(SandboxNotFoundException, lambda: Sandbox.connect(sandbox_id), "connect after kill")
    assert ctx.sbx.is_running() is False, "is_running() after kill"


def main():
    assert not os.environ.get("E2B_DEBUG"), "the scenario runs the SDK in normal mode: E2B_DEBUG must be unset"
    for name in ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL"):
        assert os.environ.get(name), f"{name} must be set"
    ctx = Ctx()
    passed, failed = 0, 0

    def run(fn):
        nonlocal passed, failed
        start = time.perf_counter()
        try:
            fn(ctx)
        except Exception as e:
            failed += 1
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
            return False
        passed += 1
        print(f"ok   {fn.__name__} ({(time.perf_counter() - start) * 1000:.0f} ms)", flush=True)
        return True

    try:
        if run(create_through_the_legacy_route):
            for fn in STEPS:
                run(fn)
    finally:
        for sandbox_id in MADE:
            try:
                Sandbox.kill(sandbox_id)
            except Exception as e:
                print(f"cleanup: kill {sandbox_id}: {type(e).__name__}: {e}", flush=True)
    print(f"scenario: {passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
