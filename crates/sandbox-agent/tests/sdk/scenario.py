"""The official E2B Python SDK against a running sandbox-agent.

Run by the Rust driver (tests/it/sdk.rs) with the venv made from requirements.lock, with:
  E2B_DEBUG=true            the SDK makes no control-plane call: Sandbox.create() returns a
                            sandbox "debug_sandbox_id" whose envd version is taken as 99.99.99
                            (every version gate open) and which has no access token;
  E2B_SANDBOX_URL           the agent's loopback URL, used as the envd base URL as it is (plain
                            http, so the SDK's transport speaks HTTP/1.1);
  SANDBOX_SCENARIO_DIR      an empty directory the scenario may use (absolute);
  SANDBOX_SCENARIO_USER     the user commands must run as when no user is given (the agent's
                            default user);
  SANDBOX_SCENARIO_HOME     optional: that user's home, which commands must see as $HOME;
  SANDBOX_SCENARIO_STEPS    optional, for debugging by hand and for `cargo xtask bench agent`:
                            a comma-separated list of the steps to run (the test drivers never
                            set it: they run them all);
  SANDBOX_SCENARIO_ROUND_TRIPS
                            optional: how many times the closing `commands.run("true")` round
                            trip is timed (default 20); its samples are printed too.

Each step asserts what the SDK returned; the first failed assertion ends the run with a non-zero
status and its step's name. The last line is "scenario: N passed, 0 failed".
"""

import hashlib
import io
import os
import sys
import threading
import time

import httpx
from e2b import CommandExitException, Sandbox, TimeoutException
from e2b.sandbox.commands.command_handle import PtySize
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

WORK = os.environ["SANDBOX_SCENARIO_DIR"]
assert os.environ.get("SANDBOX_SCENARIO_USER"), "SANDBOX_SCENARIO_USER names the default user"
BIG = 50 * 1024 * 1024
STEPS = []


def step(fn):
    STEPS.append(fn)
    return fn


def eventually(what, probe, seconds=10.0):
    """Polls `probe` until it returns a truthy value; fails naming `what`."""
    deadline = time.monotonic() + seconds
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds}s")
        time.sleep(0.05)


def running_pids(sbx):
    return {p.pid for p in sbx.commands.list()}


@step
def run_output(sbx):
    r = sbx.commands.run("echo hello; echo oops >&2")
    assert r.exit_code == 0, r
    assert r.stdout == "hello\n", repr(r.stdout)
    assert r.stderr == "oops\n", repr(r.stderr)


@step
def run_as_the_default_user(sbx):
    r = sbx.commands.run('printf "%s|%s" "$(id -un)" "$HOME"')
    user, home = r.stdout.split("|")
    assert user == os.environ["SANDBOX_SCENARIO_USER"], repr(r.stdout)
    expected_home = os.environ.get("SANDBOX_SCENARIO_HOME")
    if expected_home:
        assert home == expected_home, repr(r.stdout)


@step
def run_nonzero_exit_raises(sbx):
    try:
        sbx.commands.run("echo partial; echo bad >&2; exit 3")
    except CommandExitException as e:
        assert e.exit_code == 3, e.exit_code
        assert e.stdout == "partial\n", repr(e.stdout)
        assert e.stderr == "bad\n", repr(e.stderr)
    else:
        raise AssertionError("exit 3 did not raise CommandExitException")


@step
def run_env_and_cwd(sbx):
    r = sbx.commands.run('printf "%s|%s" "$SCENARIO_VAR" "$(pwd)"', envs={"SCENARIO_VAR": "a b=c"}, cwd=WORK)
    assert r.stdout == f"a b=c|{WORK}", repr(r.stdout)


@step
def run_stdin(sbx):
    h = sbx.commands.run("cat; echo done", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "line one\n")
    sbx.commands.send_stdin(h.pid, b"line two\n")
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "line one\nline two\ndone\n", repr(r.stdout)


@step
def run_timeout(sbx):
    marker = f"scenario-timeout-{os.getpid()}"
    start = time.monotonic()
    try:
        sbx.commands.run(f"exec -a {marker} sleep 30", timeout=1)
    except TimeoutException:
        pass
    else:
        raise AssertionError("a 30 s command with timeout=1 did not raise TimeoutException")
    assert time.monotonic() - start < 10, "the timeout took too long to fire"
    # The timeout bounds the process's life, not only the call.
    eventually(
        "the timed-out process ends",
        lambda: not any(marker in " ".join([p.cmd, *p.args]) for p in sbx.commands.list()),
    )


@step
def background_list_connect_kill(sbx):
    h = sbx.commands.run("echo started; sleep 600", background=True)
    listed = eventually("the background command is listed", lambda: [p for p in sbx.commands.list() if p.pid == h.pid])
    assert listed[0].cmd == "/bin/bash", listed[0]
    assert listed[0].args[-1] == "echo started; sleep 600", listed[0]
    h.disconnect()
    c = sbx.commands.connect(h.pid)
    assert c.pid == h.pid
    assert sbx.commands.kill(h.pid) is True
    try:
        c.wait()
    except CommandExitException as e:
        assert e.exit_code != 0, e
    else:
        raise AssertionError("a killed command ended with exit code 0")
    eventually("the killed command leaves the list", lambda: h.pid not in running_pids(sbx))
    assert sbx.commands.kill(h.pid) is False, "killing a gone pid reported success"


@step
def files_text_and_binary(sbx):
    text_path = f"{WORK}/files/nested/hello.txt"
    info = sbx.files.write(text_path, "hello, files\n")
    assert info.path == text_path, info
    assert sbx.files.read(text_path) == "hello, files\n"
    blob = bytes(range(256)) * 1024 + b"\x00\xff\r\n"
    sbx.files.write(f"{WORK}/files/blob.bin", blob)
    got = sbx.files.read(f"{WORK}/files/blob.bin", format="bytes")
    assert bytes(got) == blob, f"{len(got)} bytes back, {len(blob)} written"


@step
def files_dirs_rename_remove_exists(sbx):
    base = f"{WORK}/tree"
    assert sbx.files.make_dir(f"{base}/a/b") is True
    assert sbx.files.make_dir(f"{base}/a/b") is False, "an existing directory must answer False"
    sbx.files.write(f"{base}/a/one.txt", "1")
    names = sorted(e.name for e in sbx.files.list(f"{base}/a"))
    assert names == ["b", "one.txt"], names
    moved = sbx.files.rename(f"{base}/a/one.txt", f"{base}/two.txt")
    assert moved.path == f"{base}/two.txt", moved
    assert sbx.files.exists(f"{base}/two.txt") is True
    assert sbx.files.exists(f"{base}/a/one.txt") is False
    sbx.files.remove(f"{base}/a")
    assert sbx.files.exists(f"{base}/a") is False
    assert sbx.files.read(f"{base}/two.txt") == "1"


@step
def files_50_mib(sbx):
    path = f"{WORK}/big.bin"
    data = os.urandom(BIG)
    digest = hashlib.sha256(data).hexdigest()
    sbx.files.write(path, io.BytesIO(data))
    del data
    r = sbx.commands.run(f"sha256sum {path}")
    assert r.stdout.split()[0] == digest, "the agent's copy differs from what was written"
    h = hashlib.sha256()
    size = 0
    for chunk in sbx.files.read(path, format="stream"):
        h.update(chunk)
        size += len(chunk)
    assert size == BIG, size
    assert h.hexdigest() == digest, "the streamed read differs"


@step
def pty_create_send_resize_kill(sbx):
    out = bytearray()
    lock = threading.Lock()
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    ended = []

    def pump():
        try:
            h.wait(on_pty=lambda data: (lock.acquire(), out.extend(data), lock.release()))
        except CommandExitException as e:
            ended.append(e.exit_code)
        except Exception as e:  # the stream's own end after a kill
            ended.append(repr(e))
        else:
            ended.append(0)

    t = threading.Thread(target=pump, daemon=True)
    t.start()

    def seen(needle):
        with lock:
            return needle in out

    sbx.pty.send_stdin(h.pid, b"stty size; echo pty-$((6*7))\n")
    eventually("the PTY answers", lambda: seen(b"pty-42"))
    assert seen(b"24 80"), bytes(out)
    sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(h.pid, b"stty size\n")
    eventually("the PTY reports its new size", lambda: seen(b"30 100"))
    assert sbx.pty.kill(h.pid) is True
    t.join(10)
    assert not t.is_alive(), "the PTY's stream did not end after kill"
    assert ended and ended[0] != 0, ended


@step
def watch_dir_sees_a_created_file(sbx):
    watched = f"{WORK}/watched"
    sbx.files.make_dir(watched)
    w = sbx.files.watch_dir(watched)
    sbx.files.write(f"{watched}/created.txt", "x")

    def created():
        return [
            e
            for e in w.get_new_events()
            if e.name == "created.txt" and e.type in (FilesystemEventType.CREATE, FilesystemEventType.WRITE)
        ]

    eventually("a create event for created.txt", created)
    w.stop()


@step
def gated_upload_options(sbx):
    # The options the SDK gates on envd versions: octet-stream (0.5.7) with gzip, and metadata
    # stored as extended attributes (0.6.2), read back through get_info.
    path = f"{WORK}/gated/options.bin"
    payload = bytes(range(256)) * 64
    info = sbx.files.write(path, payload, gzip=True, use_octet_stream=True, metadata={"Purpose": "scenario"})
    assert info.path == path, info
    assert sbx.files.read(path, format="bytes", gzip=True) == payload
    got = sbx.files.get_info(path).metadata
    assert got == {"purpose": "scenario"}, got


@step
def recursive_watch_with_entries(sbx):
    # Recursive watching (0.1.4) and the entry in each event (0.6.3).
    root = f"{WORK}/deep-watch"
    sbx.files.make_dir(f"{root}/a/b")
    w = sbx.files.watch_dir(root, recursive=True, include_entry=True)
    sbx.files.write(f"{root}/a/b/nested.txt", "deep")

    def nested():
        return [e for e in w.get_new_events() if e.name.endswith("nested.txt") and e.entry is not None]

    events = eventually("an event with its entry for a file two levels down", nested)
    assert events[0].entry.name == "nested.txt", events[0].entry
    w.stop()


@step
def upload_and_download_urls(sbx):
    # Without an access token (debug mode has none) the URLs are unsigned; with one the SDK
    # would sign them, which needs the agent's access-token mode.
    path = f"{WORK}/via-url.bin"
    payload = b"through the upload url\x00\x01"
    up = sbx.upload_url(path)
    r = httpx.post(up, files={"file": ("via-url.bin", payload)}, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text)
    down = sbx.download_url(path)
    r = httpx.get(down, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.content == payload


def round_trip(sbx, n):
    """The times of `n` runs of `commands.run("true")`, in milliseconds, in run order."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        r = sbx.commands.run("true")
        times.append((time.perf_counter() - start) * 1000)
        assert r.exit_code == 0, r
    return times


def wait_for_health(url, seconds=20.0):
    """The agent was just started: wait until GET /health answers 2xx."""

    def healthy():
        try:
            return httpx.get(f"{url}/health", timeout=2).is_success
        except httpx.HTTPError:
            return False

    eventually(f"GET {url}/health answers", healthy, seconds)


def main():
    assert os.environ.get("E2B_DEBUG") == "true", "the scenario runs the SDK in debug mode"
    url = os.environ.get("E2B_SANDBOX_URL")
    assert url, "E2B_SANDBOX_URL names the agent"
    try:
        wait_for_health(url.rstrip("/"))
    except AssertionError as e:
        print(f"FAIL health: {e}", flush=True)
        print("scenario: 0 passed, 1 failed", flush=True)
        return 1
    sbx = Sandbox.create()
    assert sbx.sandbox_id == "debug_sandbox_id", sbx.sandbox_id
    only = [n for n in os.environ.get("SANDBOX_SCENARIO_STEPS", "").split(",") if n]
    unknown = set(only) - {fn.__name__ for fn in STEPS}
    assert not unknown, f"unknown steps {sorted(unknown)}"
    passed = 0
    for fn in (fn for fn in STEPS if not only or fn.__name__ in only):
        start = time.perf_counter()
        try:
            fn(sbx)
        except Exception as e:
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
            print(f"scenario: {passed} passed, 1 failed", flush=True)
            return 1
        passed += 1
        print(f"ok   {fn.__name__} ({(time.perf_counter() - start) * 1000:.0f} ms)", flush=True)
    n = int(os.environ.get("SANDBOX_SCENARIO_ROUND_TRIPS", "20"))
    assert n > 0, "SANDBOX_SCENARIO_ROUND_TRIPS must be positive"
    times = round_trip(sbx, n)
    median = sorted(times)[len(times) // 2]
    print(f"round trip: commands.run(\"true\") median {median:.1f} ms over {n} runs", flush=True)
    print("round trip samples ms: " + " ".join(f"{t:.3f}" for t in times), flush=True)
    print(f"scenario: {passed} passed, 0 failed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
