"""Ctrl-C on `kortex postmortem run --url` stops the job it started, as Ctrl-C on `kortex ask`
cancels its turn: it used to exit 130 without a word while the job went on investigating (and
spending) at the server, with nothing on screen to say so or how to stop it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.kortex_cli.test_ask import interrupt_after, interruptible
from tests.kortex_cli.test_remote import Api, api  # noqa: F401  (the module's real `kortex api`)

# An item's investigation that takes a while: every step a few slow words.
SLOW_ITEM = {"steps": [{"text": [f"looking{i} " for i in range(20)], "delay_ms": 500}], "loop": True}


def job(api: Api, job_id: str) -> dict[str, object]:  # noqa: F811
    return httpx.get(f"{api.url}/v1/postmortems/{job_id}",  # type: ignore[no-any-return]
                     headers={"Authorization": f"Bearer {api.key}"}).json()


def test_ctrl_c_cancels_the_job_and_says_so(api: Api, tmp_path: Path) -> None:  # noqa: F811
    (Path(api.env["KORTEX_TESTING__SCRIPTS_DIR"]) / "slowitem.json").write_text(json.dumps(SLOW_ITEM))
    cli = [sys.executable, "-m", "kortex_cli.main"]
    subprocess.run([*cli, "seed", "incident-archive", "--tenant", "acme"], env=api.env, check=True,
                   capture_output=True, cwd=tmp_path)
    proc = subprocess.Popen([*cli, "postmortem", "run", "--since", "30d", "--model", "scripted:slowitem",
                             "--concurrency", "2", "--url", api.url, "--api-key", api.key, "--out",
                             str(tmp_path / "pm")],
                            env=api.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interruptible,
                            cwd=tmp_path)
    lines, stderr = interrupt_after(proc, "job ")
    job_id = next(line.split()[1] for line in lines if line.startswith("job "))
    assert proc.returncode == 130, stderr.decode()
    said = stderr.decode()
    assert f"cancelled job {job_id}" in said and "(interrupted)" in said, said
    assert "Traceback" not in said
    deadline = time.monotonic() + 30
    while (status := job(api, job_id))["status"] != "cancelled" or status["counts"]["running"]:  # type: ignore[index]
        assert time.monotonic() < deadline, status  # left to run: it would go on spending
        time.sleep(0.5)


def test_an_incident_another_job_is_writing_is_not_a_success(api: Api, tmp_path: Path) -> None:  # noqa: F811
    """The second job skips the incident the first is writing: no file, so not exit 0 (a script
    that publishes ./postmortems/ next would miss it), and stderr says why and what to do."""
    (Path(api.env["KORTEX_TESTING__SCRIPTS_DIR"]) / "slowitem.json").write_text(json.dumps(SLOW_ITEM))
    cli = [sys.executable, "-m", "kortex_cli.main"]
    subprocess.run([*cli, "seed", "incident-archive", "--tenant", "acme"], env=api.env, check=True,
                   capture_output=True, cwd=tmp_path)
    headers = {"Authorization": f"Bearer {api.key}"}
    first = httpx.post(f"{api.url}/v1/postmortems", headers=headers,
                       json={"incident_ids": ["INC-1101"], "model": "scripted:slowitem"}).json()
    try:
        second = subprocess.run([*cli, "postmortem", "run", "--ids", "INC-1101", "--url", api.url, "--api-key",
                                 api.key, "--out", str(tmp_path / "pm")],
                                env=api.env, capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert second.returncode == 1, second.stdout + second.stderr
        said = " ".join(second.stderr.split())
        assert "1 of 1 post-mortems not written (INC-1101: another job is writing it" in said, said
        assert not (tmp_path / "pm" / "INC-1101.md").exists()
    finally:
        httpx.post(f"{api.url}/v1/postmortems/{first['job_id']}/cancel", headers=headers)
