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
