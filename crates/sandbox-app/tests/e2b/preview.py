"""Preview ports through the official E2B Python SDK against a running `sandbox serve`.

Run by the Rust driver (tests/it/e2b_preview.rs) with the venv made from the hashed lock, with:
  E2B_API_KEY       a tenant's bearer token;
  E2B_API_URL       http://<e2b.listen>: the control plane;
  E2B_SANDBOX_URL   the same URL (one listener serves the envd router and the preview ports);
  SANDBOX_PREVIEW_BOUND
                    the service's e2b.max_tunnels_per_sandbox (the driver sets it small).

A sandbox created with public traffic closed runs `python3 -m http.server 8000` (started with
`commands.run(..., background=True)`, bound to the sandbox's loopback, in a sandbox with network
`none`); its file is fetched through the router's `<port>-<id>` host (`get_host(8000)`) with the
sandbox's traffic token, and refused without it or with a wrong one. An `Upgrade` is switched
and carries bytes both ways. A server that never answers
holds requests open, so the per-sandbox bound answers 429 past it and frees a place when a caller
gives up. The last line is "scenario: N passed, M failed".
"""

import os
import socket
import sys
import threading
import time
import traceback
import uuid

import httpx

from e2b import Sandbox

API_URL = os.environ["E2B_API_URL"]
BOUND = int(os.environ["SANDBOX_PREVIEW_BOUND"])
RUN = uuid.uuid4().hex[:12]
SERVE_DIR = f"/home/user/preview-{RUN}"
# Random bytes, so no canned page can pass; large enough to stream in many chunks.
BLOB = os.urandom(3 * 1024 * 1024 + 17)
TOKEN_HEADER = "e2b-traffic-access-token"
# A server that accepts connections and never answers (a stuck program on a port).
SILENT_SERVER = (
    "import socket,time\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', 8001)); s.listen(64); held=[]\n"
    "while True: held.append(s.accept())\n"
)

# A server that switches to an echo protocol on `Upgrade: echo` (as a WebSocket server
# switches protocols), then sends back every byte it reads.
UPGRADE_SERVER = """
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8002)); s.listen(16)
def serve(c):
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        d = c.recv(4096)
        if not d:
            return
        head += d
    head, rest = head.split(b"\\r\\n\\r\\n", 1)
    if b"upgrade: echo" not in head.lower():
        c.sendall(b"HTTP/1.1 400 Bad Request\\r\\ncontent-length: 0\\r\\n\\r\\n")
        c.close()
        return
    c.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nconnection: upgrade\\r\\nupgrade: echo\\r\\n\\r\\n" + rest)
    while True:
        d = c.recv(65536)
        if not d:
            break
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

passed = 0
failed = 0


def step(name, fn):
    global passed, failed
    try:
        fn()
        passed += 1
        print(f"ok   {name}", flush=True)
    except Exception:  # noqa: BLE001 - every failure is reported, then the next step runs
        failed += 1
        print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)


def through_router(host, path, token=None, timeout=60.0):
    """GET `path` of `host` (a `<port>-<id>.<domain>` name) through the E2B listener."""
    headers = {"Host": host}
    if token is not None:
        headers[TOKEN_HEADER] = token
    return httpx.get(f"{API_URL}{path}", headers=headers, timeout=timeout)


def expect_error(response, status, what):
    assert response.status_code == status, f"{what}: {response.status_code} {response.text}"
    body = response.json()
    assert body.get("code") == status, f"{what}: {body}"
    assert body.get("message"), f"{what}: {body}"


def sh_quote(text):
    return "'" + text.replace("'", "'\"'\"'") + "'"


def hold_open(host, token):
    """A raw connection with one request sent and its answer never read."""
    port = int(API_URL.rsplit(":", 1)[1])
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(
        f"GET / HTTP/1.1\r\nHost: {host}\r\n{TOKEN_HEADER}: {token}\r\n\r\n".encode()
    )
    return conn


sbx = Sandbox.create(network={"allow_public_traffic": False}, timeout=600, metadata={"run": RUN})
try:
    token = sbx.traffic_access_token
    host = sbx.get_host(8000)

    def created_closed():
        assert isinstance(token, str) and token.startswith("et1."), token
        assert host == f"8000-{sbx.sandbox_id}.localhost", host

    def serves_a_file_through_the_tunnel():
        sbx.files.make_dir(SERVE_DIR)
        sbx.files.write(f"{SERVE_DIR}/blob.bin", BLOB)
        sbx.commands.run(
            "python3 -m http.server 8000 --bind 127.0.0.1", cwd=SERVE_DIR, background=True
        )
        deadline = time.monotonic() + 30
        while True:
            response = through_router(host, "/blob.bin", token)
            # 502 while the server is not listening yet.
            if response.status_code != 502 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert response.status_code == 200, f"{response.status_code} {response.text[:300]}"
        assert response.content == BLOB, f"{len(response.content)} bytes, want {len(BLOB)}"
        # The directory listing too: the server saw the path the caller asked for.
        listing = through_router(host, "/", token)
        assert listing.status_code == 200 and "blob.bin" in listing.text, listing.text[:300]

    def refused_without_the_token():
        expect_error(through_router(host, "/blob.bin"), 403, "no token")

    def refused_with_a_wrong_token():
        expect_error(through_router(host, "/blob.bin", sbx._envd_access_token), 403, "envd token")
        forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        expect_error(through_router(host, "/blob.bin", forged), 403, "forged token")

    def the_bound_answers_429_and_frees_a_place():
        sbx.commands.run(f"python3 -c {sh_quote(SILENT_SERVER)}", background=True)
        silent = sbx.get_host(8001)
        # Wait for it to listen: a request that is still pending after a second got through.
        deadline = time.monotonic() + 30
        while True:
            try:
                through_router(silent, "/", token, timeout=1.0)
                if time.monotonic() > deadline:
                    raise AssertionError("the silent server never listened")
                time.sleep(0.2)
            except httpx.ReadTimeout:
                break
        # Fill the bound with requests the server never answers, each on its own connection.
        held = [hold_open(silent, token) for _ in range(BOUND)]
        time.sleep(1.0)
        over = through_router(silent, "/", token, timeout=10.0)
        expect_error(over, 429, "past the bound")
        assert over.headers.get("retry-after") == "1", dict(over.headers)
        # Callers that hang up free their places.
        for conn in held:
            conn.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                again = through_router(silent, "/", token, timeout=1.5)
            except httpx.ReadTimeout:
                break  # relayed, and held by the server: a place was free
            assert again.status_code == 429, f"{again.status_code} {again.text}"
            assert time.monotonic() < deadline, "no place was freed"
            time.sleep(0.2)

    def an_upgrade_is_relayed_both_ways():
        sbx.files.write(f"{SERVE_DIR}/upgrade.py", UPGRADE_SERVER)
        sbx.commands.run(f"python3 {SERVE_DIR}/upgrade.py", background=True)
        host = sbx.get_host(8002)
        port = int(API_URL.rsplit(":", 1)[1])
        deadline = time.monotonic() + 30
        while True:
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            conn.sendall(
                (
                    f"GET /echo HTTP/1.1\r\nHost: {host}\r\n{TOKEN_HEADER}: {token}\r\n"
                    "Connection: Upgrade\r\nUpgrade: echo\r\n\r\n"
                ).encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
            status = head.split(b" ", 2)[1] if b" " in head else b""
            if status != b"502" or time.monotonic() > deadline:
                break
            conn.close()
            time.sleep(0.2)
        assert status == b"101", head.decode(errors="replace")
        assert b"upgrade: echo" in head.lower(), head
        head, early = head.split(b"\r\n\r\n", 1)
        payload = os.urandom(256 * 1024 + 3)
        received = bytearray(early)

        def read_back():
            while len(received) < len(payload):
                chunk = conn.recv(65536)
                if not chunk:
                    return
                received.extend(chunk)

        reader = threading.Thread(target=read_back)
        reader.start()
        for at in range(0, len(payload), 10_000):
            conn.sendall(payload[at : at + 10_000])
        reader.join(60)
        conn.close()
        assert bytes(received) == payload, f"{len(received)} bytes back, want {len(payload)}"

    step("created_closed", created_closed)
    step("serves_a_file_through_the_tunnel", serves_a_file_through_the_tunnel)
    step("refused_without_the_token", refused_without_the_token)
    step("refused_with_a_wrong_token", refused_with_a_wrong_token)
    step("an_upgrade_is_relayed_both_ways", an_upgrade_is_relayed_both_ways)
    step("the_bound_answers_429_and_frees_a_place", the_bound_answers_429_and_frees_a_place)
finally:
    sbx.kill()


print(f"scenario: {passed} passed, {failed} failed", flush=True)
sys.exit(0 if failed == 0 else 1)
