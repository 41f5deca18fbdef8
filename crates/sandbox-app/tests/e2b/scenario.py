"""The official E2B Python SDK, in normal mode, against a running `sandbox serve` with its E2B API on.

Run by the Rust driver (tests/it/e2b_sdk.rs) with the venv made from the hashed lock, with:
  E2B_API_KEY       a tenant's bearer token (the E2B API key is the tenant's token);
  E2B_API_URL       http://<e2b.listen>: the control plane;
  E2B_SANDBOX_URL   the same URL: one listener serves the envd router too, which tells the
                    sandboxes apart by the E2b-Sandbox-Id header the SDK sends;
  E2B_DEBUG         unset: the SDK really creates, lists, connects, times out and kills through
                    the control plane, and authenticates to envd with each sandbox's access token;
  SANDBOX_SCENARIO_STEPS
                    optional, for debugging by hand: a comma-separated list of the steps to run
                    after `create` (the driver never sets it: it runs them all).

Each step asserts what the SDK returned. `create` makes the sandbox every later step uses; when
it fails nothing else can run. A later step that fails is reported and the others still run, so
one run names every failure. Every sandbox the scenario made is killed at the end. The last line
is "scenario: N passed, M failed".
"""

import hashlib
import os
import re
import sys
import threading
import time
import urllib.parse
import uuid
from datetime import datetime, timedelta, timezone

import httpx
from packaging.version import Version

from e2b import (
    AuthenticationException,
    CommandExitException,
    ConnectionConfig,
    FileNotFoundException,
    FilesystemEventType,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

# Who E2B-API sandboxes run commands as when a call names no user, and where they start.
USER = "user"
HOME = "/home/user"
WORK = f"{HOME}/scenario"
# The port the SDK names in E2b-Sandbox-Port for envd.
ENVD_PORT = str(ConnectionConfig.envd_port)
# One run's mark: its sandboxes carry it, so listings can be checked against exactly them.
RUN = uuid.uuid4().hex[:12]
METADATA = {"scenario": "e2b-sdk", "run": RUN}
CREATE_TIMEOUT = 600
ID_PATTERN = re.compile(r"^i[a-z0-9]{19}$")
SKEW = timedelta(seconds=5)

STEPS = []
# Every sandbox made, killed at the end whatever happened.
MADE = []


def step(fn):
    STEPS.append(fn)
    return fn


def eventually(what, probe, seconds=15.0):
    """Polls `probe` until it returns a truthy value; fails naming `what`."""
    deadline = time.monotonic() + seconds
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds}s")
        time.sleep(0.1)


def raises(exc_type, fn, what):
    """Runs `fn`, which must raise `exc_type` (not a subclass of something else, not JSON or
    key errors); the exception."""
    try:
        got = fn()
    except exc_type as e:
        return e
    except Exception as e:
        raise AssertionError(f"{what}: raised {type(e).__name__}: {e}, not {exc_type.__name__}") from e
    raise AssertionError(f"{what}: returned {got!r}, did not raise {exc_type.__name__}")


def create(**kwargs):
    sbx = Sandbox.create(**kwargs)
    MADE.append(sbx.sandbox_id)
    return sbx


def running_pids(sbx):
    return {p.pid for p in sbx.commands.list()}


def envd_headers(sandbox_id):
    """The headers that name a sandbox to the envd router. A signed URL made with a
    `sandbox_url` override is the override's URL, which names no sandbox: a client (or a
    proxy in front of it) says which one, as the SDK itself does."""
    return {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": ENVD_PORT}


def without_query(url, *names):
    """`url` with the query parameters `names` removed."""
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k not in names]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def list_all(query, limit):
    """Every sandbox `Sandbox.list` yields for `query`, page by page; the IDs and the page sizes."""
    pages = Sandbox.list(query=query, limit=limit)
    ids, sizes = [], []
    while pages.has_next:
        items = pages.next_items()
        sizes.append(len(items))
        ids.extend(i.sandbox_id for i in items)
        assert len(sizes) < 50, "the paginator never ends"
    return ids, sizes


class Ctx:
    sbx = None


# --- create, and what the control plane says of the sandbox ---------------------------------


def create_with_metadata_envs_timeout(ctx):
    before = datetime.now(timezone.utc)
    sbx = create(metadata=METADATA, envs={"SCENARIO_CREATE_ENV": "set at create"}, timeout=CREATE_TIMEOUT)
    ctx.sbx = sbx
    assert ID_PATTERN.match(sbx.sandbox_id), sbx.sandbox_id
    assert sbx._envd_access_token, "create answered no envdAccessToken"
    assert sbx._envd_version >= Version("0.4.0"), sbx._envd_version
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id, info
    assert info.metadata == METADATA, info.metadata
    assert info.template_id == "base", info.template_id
    assert info.state == SandboxState.RUNNING, info.state
    assert info.cpu_count >= 1 and info.memory_mb >= 128, info
    assert Version(info.envd_version) == sbx._envd_version, (info.envd_version, sbx._envd_version)
    assert info.started_at.tzinfo is not None and info.end_at.tzinfo is not None, info
    lifetime = (info.end_at - info.started_at).total_seconds()
    assert abs(lifetime - CREATE_TIMEOUT) < 60, f"end_at is {lifetime:.0f}s after started_at"
    # Clocks: the service's and this process's are the same machine's; a second's rounding.
    assert before - SKEW <= info.started_at <= datetime.now(timezone.utc) + SKEW, (info.started_at, before)
    assert sbx.is_running() is True
    r = sbx.commands.run('printf %s "$SCENARIO_CREATE_ENV"')
    assert r.stdout == "set at create", repr(r.stdout)


# --- commands ------------------------------------------------------------------------------


@step
def run_output_and_stderr(ctx):
    r = ctx.sbx.commands.run("echo hello; echo oops >&2")
    assert r.exit_code == 0, r
    assert r.stdout == "hello\n", repr(r.stdout)
    assert r.stderr == "oops\n", repr(r.stderr)


@step
def run_as_user_in_home_by_default(ctx):
    r = ctx.sbx.commands.run('printf "%s|%s|%s" "$(id -un)" "$(pwd)" "$HOME"')
    assert r.stdout == f"{USER}|{HOME}|{HOME}", repr(r.stdout)


@step
def run_nonzero_exit_raises(ctx):
    e = raises(
        CommandExitException,
        lambda: ctx.sbx.commands.run("echo partial; echo bad >&2; exit 3"),
        "exit 3",
    )
    assert e.exit_code == 3, e.exit_code
    assert e.stdout == "partial\n", repr(e.stdout)
    assert e.stderr == "bad\n", repr(e.stderr)


@step
def run_env_and_cwd(ctx):
    ctx.sbx.files.make_dir(f"{WORK}/cwd")
    r = ctx.sbx.commands.run(
        'printf "%s|%s|%s" "$SCENARIO_VAR" "$(pwd)" "$SCENARIO_CREATE_ENV"',
        envs={"SCENARIO_VAR": "a b=c"},
        cwd=f"{WORK}/cwd",
    )
    # The call's env comes on top of the create's.
    assert r.stdout == f"a b=c|{WORK}/cwd|set at create", repr(r.stdout)


@step
def run_timeout_raises(ctx):
    marker = f"scenario-timeout-{RUN}"
    start = time.monotonic()
    raises(TimeoutException, lambda: ctx.sbx.commands.run(f"exec -a {marker} sleep 30", timeout=1), "timeout=1")
    assert time.monotonic() - start < 10, "the timeout took too long to fire"
    # The timeout bounds the process's life, not only the call.
    eventually(
        "the timed-out process ends",
        lambda: not any(marker in " ".join([p.cmd, *p.args]) for p in ctx.sbx.commands.list()),
    )


@step
def run_stdin(ctx):
    h = ctx.sbx.commands.run("cat; echo done", background=True, stdin=True)
    ctx.sbx.commands.send_stdin(h.pid, "line one\n")
    h.send_stdin(b"line two\n")
    ctx.sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "line one\nline two\ndone\n", repr(r.stdout)


@step
def background_connect_by_pid_then_kill(ctx):
    sbx = ctx.sbx
    h = sbx.commands.run("echo started; sleep 600", background=True)
    listed = eventually("the background command is listed", lambda: [p for p in sbx.commands.list() if p.pid == h.pid])
    assert listed[0].cmd == "/bin/bash", listed[0]
    assert listed[0].args[-1] == "echo started; sleep 600", listed[0]
    c = sbx.commands.connect(h.pid)
    assert c.pid == h.pid
    assert sbx.commands.kill(h.pid) is True
    e = raises(CommandExitException, c.wait, "waiting for a killed command")
    assert e.exit_code != 0, e
    eventually("the killed command leaves the list", lambda: h.pid not in running_pids(sbx))
    assert sbx.commands.kill(h.pid) is False, "killing a gone pid reported success"


@step
def dropped_handle_keeps_the_process(ctx):
    sbx = ctx.sbx
    h = sbx.commands.run("for i in $(seq 1 3000); do echo tick-$i; sleep 0.1; done", background=True)
    pid = h.pid
    # Dropping the handle closes its stream; envd semantics: the process lives on.
    h.disconnect()
    time.sleep(1.0)
    assert pid in running_pids(sbx), "the process ended when its handle was dropped"
    seen = []
    c = sbx.commands.connect(pid, timeout=30)
    assert c.pid == pid

    def pump():
        try:
            c.wait(on_stdout=seen.append)
        except Exception as e:  # the kill below ends it
            seen.append(e)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    eventually("output after reconnecting", lambda: any(isinstance(s, str) and "tick-" in s for s in seen))
    assert c.kill() is True
    t.join(15)
    assert not t.is_alive(), "the reconnected stream did not end after kill"
    eventually("the killed command leaves the list", lambda: pid not in running_pids(sbx))


# --- files ---------------------------------------------------------------------------------


@step
def files_write_read_list_mkdir_rename_remove_exists(ctx):
    files = ctx.sbx.files
    base = f"{WORK}/tree"
    info = files.write(f"{base}/nested/hello.txt", "hello, files\n")
    assert info.path == f"{base}/nested/hello.txt", info
    assert files.read(f"{base}/nested/hello.txt") == "hello, files\n"
    # Written as the default user.
    r = ctx.sbx.commands.run(f"stat -c %U {base}/nested/hello.txt")
    assert r.stdout.strip() == USER, repr(r.stdout)
    assert files.make_dir(f"{base}/a/b") is True
    assert files.make_dir(f"{base}/a/b") is False, "an existing directory must answer False"
    files.write(f"{base}/a/one.txt", "1")
    names = sorted(e.name for e in files.list(f"{base}/a"))
    assert names == ["b", "one.txt"], names
    moved = files.rename(f"{base}/a/one.txt", f"{base}/two.txt")
    assert moved.path == f"{base}/two.txt", moved
    assert files.exists(f"{base}/two.txt") is True
    assert files.exists(f"{base}/a/one.txt") is False
    files.remove(f"{base}/a")
    assert files.exists(f"{base}/a") is False
    assert files.read(f"{base}/two.txt") == "1"
    # A relative path is the user's home's.
    files.write("relative.txt", "at home")
    assert files.read(f"{HOME}/relative.txt") == "at home"


@step
def files_bytes_round_trip(ctx):
    path = f"{WORK}/random.bin"
    data = os.urandom(4 * 1024 * 1024 + 3)
    digest = hashlib.sha256(data).hexdigest()
    ctx.sbx.files.write(path, data)
    r = ctx.sbx.commands.run(f"sha256sum {path}")
    assert r.stdout.split()[0] == digest, "the sandbox's copy differs from what was written"
    got = ctx.sbx.files.read(path, format="bytes")
    assert len(got) == len(data), f"{len(got)} bytes back, {len(data)} written"
    assert hashlib.sha256(bytes(got)).hexdigest() == digest, "the bytes read back differ"


@step
def missing_file_raises_file_not_found(ctx):
    missing = f"{WORK}/no-such-file-{RUN}"
    raises(FileNotFoundException, lambda: ctx.sbx.files.read(missing), "reading a missing file")
    assert ctx.sbx.files.exists(missing) is False


@step
def upload_and_download_urls_are_signed(ctx):
    sbx = ctx.sbx
    path = f"{WORK}/via-url.bin"
    payload = os.urandom(64 * 1024)
    up = sbx.upload_url(path)
    assert "signature=v1_" in up, up
    headers = envd_headers(sbx.sandbox_id)
    # No access token: the signature alone authorises the request.
    r = httpx.post(up, headers=headers, files={"file": ("via-url.bin", payload)}, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.json()[0]["path"] == path, r.text
    down = sbx.download_url(path)
    r = httpx.get(down, headers=headers, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.content == payload
    # The sandbox named by Host instead of the headers: `<port>-<sandboxID>.<domain>`.
    r = httpx.get(down, headers={"Host": f"{ENVD_PORT}-{sbx.sandbox_id}.localhost"}, timeout=30)
    assert r.status_code == 200, ("Host routing", r.status_code, r.text)
    assert r.content == payload
    # Unsigned, or signed for another path or operation: refused.
    r = httpx.get(without_query(down, "signature"), headers=headers, timeout=30)
    assert r.status_code == 401, ("unsigned", r.status_code, r.text)
    other = sbx.download_url(f"{WORK}/another.bin")
    other_signature = urllib.parse.parse_qs(urllib.parse.urlsplit(other).query)["signature"][0]
    forged = without_query(down, "signature") + "&signature=" + urllib.parse.quote(other_signature, safe="")
    r = httpx.get(forged, headers=headers, timeout=30)
    assert r.status_code == 401, ("another path's signature", r.status_code, r.text)
    r = httpx.post(down, headers=headers, files={"file": ("x", b"x")}, timeout=30)
    assert r.status_code == 401, ("a read signature used to write", r.status_code, r.text)


@step
def expired_signature_is_refused(ctx):
    sbx = ctx.sbx
    path = f"{WORK}/expiring.txt"
    sbx.files.write(path, "short-lived")
    fresh = sbx.download_url(path, use_signature_expiration=120)
    assert "signature_expiration=" in fresh, fresh
    r = httpx.get(fresh, headers=envd_headers(sbx.sandbox_id), timeout=30)
    assert r.status_code == 200 and r.text == "short-lived", (r.status_code, r.text)
    short = sbx.download_url(path, use_signature_expiration=1)
    time.sleep(2.5)
    r = httpx.get(short, headers=envd_headers(sbx.sandbox_id), timeout=30)
    assert r.status_code == 401, ("expired", r.status_code, r.text)
    body = r.json()
    assert isinstance(body.get("code"), int) and isinstance(body.get("message"), str), r.text


@step
def pty_create_send_resize_kill(ctx):
    sbx = ctx.sbx
    out = bytearray()
    lock = threading.Lock()
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    ended = []

    def keep(data):
        with lock:
            out.extend(data)

    def pump():
        try:
            h.wait(on_pty=keep)
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

    sbx.pty.send_stdin(h.pid, b"stty size; echo pty-$((6*7)) $(id -un)\n")
    eventually("the PTY answers", lambda: seen(f"pty-42 {USER}".encode()))
    assert seen(b"24 80"), bytes(out)
    sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(h.pid, b"stty size\n")
    eventually("the PTY reports its new size", lambda: seen(b"30 100"))
    assert sbx.pty.kill(h.pid) is True
    t.join(15)
    assert not t.is_alive(), "the PTY's stream did not end after kill"
    assert ended and ended[0] != 0, ended


@step
def watch_dir_sees_a_created_file(ctx):
    sbx = ctx.sbx
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


# --- the control plane ---------------------------------------------------------------------


@step
def list_with_a_metadata_filter_in_pages(ctx):
    pair = {"scenario-list": f"{RUN}-pages"}
    listed = [create(metadata={**pair, "n": str(n)}, timeout=300) for n in range(3)]
    want = sorted(s.sandbox_id for s in listed)
    ids, sizes = list_all(SandboxQuery(metadata=pair), limit=2)
    assert sorted(ids) == want, f"listed {ids}, made {want}"
    assert len(ids) == len(set(ids)), f"a sandbox seen twice: {ids}"
    assert sizes == [2, 1], f"pages of {sizes} for 3 sandboxes with limit 2"
    assert ctx.sbx.sandbox_id not in ids, "a sandbox without the pair was listed"
    # The state filter: they run, none is paused.
    ids, _ = list_all(SandboxQuery(metadata=pair, state=[SandboxState.RUNNING]), limit=2)
    assert sorted(ids) == want, f"running: listed {ids}, made {want}"
    ids, _ = list_all(SandboxQuery(metadata=pair, state=[SandboxState.PAUSED]), limit=2)
    assert ids == [], f"paused: listed {ids}"
    # The run's main sandbox is found by its own pair, with its metadata.
    pages = Sandbox.list(query=SandboxQuery(metadata=METADATA))
    main = pages.next_items()
    assert [i.sandbox_id for i in main] == [ctx.sbx.sandbox_id], main
    assert main[0].metadata == METADATA, main[0].metadata
    assert main[0].state == SandboxState.RUNNING, main[0]
    for s in listed:
        assert s.kill() is True
    ids, _ = list_all(SandboxQuery(metadata=pair), limit=2)
    assert ids == [], f"killed sandboxes still listed: {ids}"


@step
def list_filter_values_with_reserved_characters(ctx):
    # The SDK percent-encodes keys and values, then the form string, then the query: the
    # server must undo each layer, so a value with spaces, & and = matches itself only.
    value = f"{RUN} a&b=c/%"
    s = create(metadata={"scenario-odd": value}, timeout=300)
    try:
        ids, _ = list_all(SandboxQuery(metadata={"scenario-odd": value}), limit=10)
        assert ids == [s.sandbox_id], ids
        ids, _ = list_all(SandboxQuery(metadata={"scenario-odd": f"{RUN} a"}), limit=10)
        assert ids == [], f"a prefix of the value matched: {ids}"
        assert s.get_info().metadata == {"scenario-odd": value}
    finally:
        s.kill()


@step
def set_timeout_moves_the_end(ctx):
    sbx = ctx.sbx
    for timeout in (1200, 700):
        sbx.set_timeout(timeout)
        info = sbx.get_info()
        left = (info.end_at - datetime.now(timezone.utc)).total_seconds()
        assert abs(left - timeout) < 60, f"set_timeout({timeout}): end_at is {left:.0f}s away"


@step
def connect_by_id(ctx):
    ctx.sbx.files.write(f"{WORK}/before-connect.txt", "written before connect")
    again = Sandbox.connect(ctx.sbx.sandbox_id)
    assert again.sandbox_id == ctx.sbx.sandbox_id
    assert again._envd_access_token, "connect answered no envdAccessToken"
    r = again.commands.run("echo through-connect")
    assert r.stdout == "through-connect\n", repr(r.stdout)
    assert again.files.read(f"{WORK}/before-connect.txt") == "written before connect"


# --- pause and resume ----------------------------------------------------------------------

# Counts in the shell's memory and writes each value: after a resume the file goes on from the
# value in memory, which a restarted process could not know.
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done"


def counter(sbx):
    text = sbx.files.read("/tmp/counter").strip()
    return int(text) if text else 0


@step
def pause_then_connect_keeps_files_and_a_running_process(ctx):
    pair = {"scenario-pause": RUN}
    sbx = create(metadata=pair, timeout=300)
    sbx.files.write(f"{HOME}/paused.txt", "kept through the pause")
    handle = sbx.commands.run(COUNTER, background=True)
    eventually("the counter counts", lambda: sbx.files.exists("/tmp/counter") and counter(sbx) >= 3)
    before = counter(sbx)
    assert sbx.pause() is True, "the first pause"
    info = Sandbox.get_info(sbx.sandbox_id)
    assert info.state == SandboxState.PAUSED, info.state
    paused, _ = list_all(SandboxQuery(metadata=pair, state=[SandboxState.PAUSED]), limit=10)
    assert paused == [sbx.sandbox_id], paused
    running, _ = list_all(SandboxQuery(metadata=pair, state=[SandboxState.RUNNING]), limit=10)
    assert running == [], running
    assert sbx.pause() is False, "a second pause of a paused sandbox"
    # Three seconds frozen: a counter ticking every 0.2 s that ran on would move by about
    # fifteen; the slack covers the ticks between the last read and the pause taking hold.
    time.sleep(3)
    again = Sandbox.connect(sbx.sandbox_id, timeout=300)
    assert again.sandbox_id == sbx.sandbox_id
    thawed = counter(again)
    assert before <= thawed <= before + 6, f"frozen means no counting: {before} before, {thawed} after"
    assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    assert handle.pid in running_pids(again), f"pid {handle.pid} did not survive the pause"
    eventually("the counter counts on after the resume", lambda: counter(again) > thawed + 2)
    assert again.files.read(f"{HOME}/paused.txt") == "kept through the pause"
    r = again.commands.run("echo after-resume")
    assert r.stdout == "after-resume\n", repr(r.stdout)
    # The first handle works again too: the resume re-opened the channel to its agent.
    assert sbx.files.read(f"{HOME}/paused.txt") == "kept through the pause"
    assert sbx.is_running() is True
    assert sbx.kill() is True


# --- typed errors --------------------------------------------------------------------------


@step
def wrong_api_key_raises_authentication(ctx):
    wrong = "e2b_" + uuid.uuid4().hex
    raises(AuthenticationException, lambda: Sandbox.list(api_key=wrong).next_items(), "list with a wrong key")
    raises(AuthenticationException, lambda: Sandbox.get_info(ctx.sbx.sandbox_id, api_key=wrong), "get_info with a wrong key")
    raises(AuthenticationException, lambda: Sandbox.create(api_key=wrong, timeout=60), "create with a wrong key")


@step
def wrong_access_token_raises_authentication(ctx):
    sbx = ctx.sbx
    sbx.files.write(f"{WORK}/guarded.txt", "guarded")
    token = sbx._envd_access_token
    tampered = token[:-1] + ("A" if token[-1] != "A" else "B")
    # A sandbox object as the SDK builds one, with the tampered token where it keeps it.
    forged = Sandbox(
        sandbox_id=sbx.sandbox_id,
        sandbox_domain=sbx.sandbox_domain,
        envd_version=sbx._envd_version,
        envd_access_token=tampered,
        connection_config=ConnectionConfig(
            extra_sandbox_headers={**envd_headers(sbx.sandbox_id), "X-Access-Token": tampered},
            **sbx.connection_config.get_api_params(),
        ),
    )
    raises(AuthenticationException, lambda: forged.commands.run("echo should-not-run"), "a command with a wrong token")
    raises(AuthenticationException, lambda: forged.files.read(f"{WORK}/guarded.txt"), "a read with a wrong token")
    raises(AuthenticationException, lambda: forged.files.write(f"{WORK}/forged.txt", "x"), "a write with a wrong token")
    raises(AuthenticationException, lambda: forged.commands.list(), "a process list with a wrong token")
    assert sbx.files.exists(f"{WORK}/forged.txt") is False, "the forged write landed"
    # A URL signed with the wrong token is refused too.
    r = httpx.get(forged.download_url(f"{WORK}/guarded.txt"), headers=envd_headers(sbx.sandbox_id), timeout=30)
    assert r.status_code == 401, (r.status_code, r.text)


@step
def missing_sandbox_raises_not_found(ctx):
    missing = "i" + uuid.uuid4().hex[:19]
    assert ID_PATTERN.match(missing)
    raises(SandboxNotFoundException, lambda: Sandbox.connect(missing), "connect to a missing sandbox")
    raises(SandboxNotFoundException, lambda: Sandbox.get_info(missing), "get_info of a missing sandbox")
    raises(SandboxNotFoundException, lambda: Sandbox.set_timeout(missing, 60), "set_timeout of a missing sandbox")
    assert Sandbox.kill(missing) is False, "killing a missing sandbox reported success"


# Each option the service cannot honour, as the SDK spells it, and the wire field the refusal
# must name.
REFUSED = [
    ("volumeMounts", {"volume_mounts": {"/mnt/data": "scenario-volume"}}),
    ("mcp", {"mcp": {"exa": {"apiKey": "not-a-key"}}}),
    ("iam", {"iam": {"tokens": {"aws": {"audience": "sts.amazonaws.com", "token_type": "JWT-SVID"}}}}),
    ("allowOut", {"network": {"allow_out": ["api.example.com"]}}),
    ("egressProxy", {"network": {"egress_proxy": {"address": "127.0.0.1:1080"}}}),
    ("rules", {"network": {"rules": {"api.example.com": [{"transform": {"headers": {"X-Scenario": "1"}}}]}}}),
]


@step
def refused_options_name_their_field(ctx):
    pair = {"scenario-refused": RUN}
    for field, kwargs in REFUSED:
        e = raises(
            SandboxException,
            lambda: create(template="base", metadata=pair, timeout=60, **kwargs),
            f"a create with {field}",
        )
        assert getattr(e, "status_code", None) == 400, f"{field}: {type(e).__name__} {getattr(e, 'status_code', None)}: {e}"
        assert field in str(e), f"the refusal of {field} does not name it: {e}"
    ids, _ = list_all(SandboxQuery(metadata=pair), limit=10)
    assert ids == [], f"a refused create left sandboxes: {ids}"


# --- kill ----------------------------------------------------------------------------------


@step
def kill_then_connect_raises_not_found(ctx):
    sbx = ctx.sbx
    sandbox_id = sbx.sandbox_id
    assert sbx.kill() is True
    raises(SandboxNotFoundException, lambda: Sandbox.connect(sandbox_id), "connect after kill")
    raises(SandboxNotFoundException, lambda: Sandbox.get_info(sandbox_id), "get_info after kill")
    assert Sandbox.kill(sandbox_id) is False, "a second kill reported success"
    ids, _ = list_all(SandboxQuery(metadata=METADATA), limit=10)
    assert ids == [], f"a killed sandbox is still listed: {ids}"
    # Its envd is gone with it, as the SDK tells: not running, and a command fails as on a
    # sandbox that is not there (not as a credential problem: its token was genuine).
    assert sbx.is_running() is False, "is_running() after kill"
    raises(SandboxException, lambda: sbx.commands.run("echo after-kill"), "a command after kill")


def main():
    assert not os.environ.get("E2B_DEBUG"), "the scenario runs the SDK in normal mode: E2B_DEBUG must be unset"
    for name in ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL"):
        assert os.environ.get(name), f"{name} must be set"
    only = [n for n in os.environ.get("SANDBOX_SCENARIO_STEPS", "").split(",") if n]
    unknown = set(only) - {fn.__name__ for fn in STEPS}
    assert not unknown, f"unknown steps {sorted(unknown)}"
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
        if run(create_with_metadata_envs_timeout):
            for fn in (fn for fn in STEPS if not only or fn.__name__ in only):
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
