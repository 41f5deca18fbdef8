"""Template builds through the official E2B Python SDK, against a running `sandbox serve`.

Run by the Rust driver (tests/it/e2b_templates.rs) with the SDK's venv, with:
  E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL   as for scenario.py;
  SANDBOX_TEMPLATES_IMAGE    an image on the engine that e2b.build_images allows (the Debian
                             sandbox image);
  SANDBOX_TEMPLATES_ABSENT   an image e2b.build_images allows but the engine does not have.

Steps, each asserting what the SDK returned:
  build      Template.build(Template().from_image(<image>), alias) reaches ready;
  boot       Sandbox.create(<alias>) boots it and runs a command in it, as by `alias:tag` and
             by the template ID;
  tags       assign_tags / get_tags / remove_tags;
  absent     a build from the absent image raises the SDK's BuildException with the reason;
  refused    a build with a RUN step is refused at build start (400 naming `steps`);
  in_use     deleting the template while a sandbox uses it is 409 {"code": 409, ...}, and after
             the kill the delete succeeds and the name is free again.
The last line is "scenario: N passed, M failed" (what the driver checks).
"""

import os
import sys
import time
import traceback
import uuid

import httpx

from e2b import BuildException, Sandbox, SandboxException, Template

IMAGE = os.environ["SANDBOX_TEMPLATES_IMAGE"]
ABSENT = os.environ["SANDBOX_TEMPLATES_ABSENT"]
API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]
RUN = uuid.uuid4().hex[:8]
ALIAS = f"tpl-{RUN}"
CREATE_TIMEOUT = 120

state = {}
sandboxes = []


def api(method, path, **kwargs):
    return httpx.request(method, f"{API}{path}", headers={"X-API-Key": KEY}, timeout=60, **kwargs)


def step_build():
    logs = []
    info = Template.build(
        Template().from_image(IMAGE),
        alias=ALIAS,
        cpu_count=1,
        memory_mb=512,
        on_build_logs=logs.append,
    )
    assert info.template_id and info.build_id, info
    assert info.alias == ALIAS, info
    assert any("local image" in str(entry.message) for entry in logs), [str(e) for e in logs]
    assert Template.alias_exists(ALIAS), "alias_exists is False after the build"
    assert not Template.alias_exists(f"free-{RUN}"), "an unused alias exists"
    listed = api("GET", "/v2/templates").json()
    mine = [t for t in listed if t["templateID"] == info.template_id]
    assert len(mine) == 1 and mine[0]["buildStatus"] == "ready", listed
    state["template_id"] = info.template_id
    state["build_id"] = info.build_id


def step_boot():
    for name in [ALIAS, f"{ALIAS}:default", state["template_id"]]:
        sbx = Sandbox.create(name, timeout=CREATE_TIMEOUT)
        sandboxes.append(sbx)
        result = sbx.commands.run("head -1 /etc/os-release; id -un")
        assert result.exit_code == 0, result
        assert "Debian" in result.stdout, result.stdout
        assert result.stdout.strip().endswith("user"), result.stdout
        sbx.kill()
        sandboxes.remove(sbx)


def step_tags():
    assigned = Template.assign_tags(f"{ALIAS}:default", ["v1"])
    assert assigned.tags == ["v1"], assigned
    assert assigned.build_id == state["build_id"], assigned
    tags = sorted(t.tag for t in Template.get_tags(ALIAS))
    assert tags == ["default", "v1"], tags
    sbx = Sandbox.create(f"{ALIAS}:v1", timeout=CREATE_TIMEOUT)
    sandboxes.append(sbx)
    assert sbx.commands.run("true").exit_code == 0
    sbx.kill()
    sandboxes.remove(sbx)
    Template.remove_tags(ALIAS, ["v1"])
    tags = sorted(t.tag for t in Template.get_tags(ALIAS))
    assert tags == ["default"], tags
    try:
        sbx = Sandbox.create(f"{ALIAS}:v1", timeout=CREATE_TIMEOUT)
        sandboxes.append(sbx)
        raise AssertionError("a removed tag still boots")
    except SandboxException as e:
        assert "not found" in str(e), e


def step_absent():
    try:
        Template.build(Template().from_image(ABSENT), alias=f"absent-{RUN}")
        raise AssertionError("a build from an absent image succeeded")
    except BuildException as e:
        assert ABSENT in str(e), f"the reason does not name the image: {e}"
        assert "never pull" in str(e), e


def step_refused():
    try:
        Template.build(Template().from_image(IMAGE).run_cmd("echo hi"), alias=f"steps-{RUN}")
        raise AssertionError("a build with a RUN step was accepted")
    except BuildException as e:
        assert "steps" in str(e), e


def step_in_use():
    sbx = Sandbox.create(ALIAS, timeout=CREATE_TIMEOUT)
    sandboxes.append(sbx)
    answer = api("DELETE", f"/templates/{state['template_id']}")
    assert answer.status_code == 409, (answer.status_code, answer.text)
    body = answer.json()
    assert body["code"] == 409 and sbx.sandbox_id in body["message"], body
    try:
        Sandbox.delete_snapshot(state["template_id"])
        raise AssertionError("the SDK's delete of a template in use succeeded")
    except SandboxException as e:
        assert "409" in str(e), e
    sbx.kill()
    sandboxes.remove(sbx)
    assert Sandbox.delete_snapshot(state["template_id"]) is True
    assert not Template.alias_exists(ALIAS), "the deleted template's alias still exists"
    assert Sandbox.delete_snapshot(state["template_id"]) is False, "a second delete found it"
    try:
        sbx = Sandbox.create(ALIAS, timeout=CREATE_TIMEOUT)
        sandboxes.append(sbx)
        raise AssertionError("the deleted template still boots")
    except SandboxException as e:
        assert "not found" in str(e), e


STEPS = [
    ("build", step_build),
    ("boot", step_boot),
    ("tags", step_tags),
    ("absent", step_absent),
    ("refused", step_refused),
    ("in_use", step_in_use),
]


def main():
    passed, failed = 0, 0
    for name, step in STEPS:
        started = time.monotonic()
        try:
            step()
            passed += 1
            print(f"ok   {name} ({time.monotonic() - started:.1f}s)", flush=True)
        except Exception:  # noqa: BLE001 - every failure is reported, then the next step runs
            failed += 1
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
            if name == "build":
                break
    for sbx in list(sandboxes):
        try:
            sbx.kill()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    print(f"scenario: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
