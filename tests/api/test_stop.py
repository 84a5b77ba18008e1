"""An API process told to stop (SIGTERM, as a deploy or `docker stop` sends it) ends its open
event streams at once, each like a finished one, so their clients resume from their last event;
it then exits cleanly, without waiting out the graceful timeout or cutting a client off mid-event.
A real `kortex api` process (embedded mode), a slow model, an SSE client reading."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.kortex_cli.test_remote import free_port, wait_until_serving

ROOT = Path(__file__).resolve().parents[2]
SLOW = {"steps": [{"text": [f"word{i} " for i in range(30)], "delay_ms": 500}]}  # 15 s of answer


def test_a_stopping_api_ends_its_event_streams_cleanly_and_exits_without_waiting_them_out(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "slow.json").write_text(json.dumps(SLOW))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env.update(KORTEX_HOME=str(tmp_path / "kortex"), PYTHONPATH=str(ROOT), KORTEX_LOG_LEVEL="INFO",
               KORTEX_TESTING__ENABLE_TEST_PROVIDERS="true", KORTEX_TESTING__SCRIPTS_DIR=str(tmp_path / "scripts"),
               KORTEX_TURN__SHUTDOWN_GRACE="0")  # the in-process worker hands its step back at once
    cli = [sys.executable, "-m", "kortex_cli.main"]
    made = subprocess.run([*cli, "admin", "create-tenant", "acme"], env=env, capture_output=True, text=True,
                          check=True, cwd=tmp_path)
    headers = {"Authorization": f"Bearer {made.stdout.strip().splitlines()[-1]}"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "api.log").open("w+")
    proc = subprocess.Popen([*cli, "api", "--port", str(port)], env=env, cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_until_serving(url, proc)
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            session = http.post("/v1/sessions", json={"model": "scripted:slow"}).json()["id"]
            turn = http.post(f"/v1/sessions/{session}/messages", json={"content": "why?"}).json()
            events: list[tuple[str, str]] = []
            with http.stream("GET", turn["events_url"], headers={"Accept": "text/event-stream"},
                             timeout=httpx.Timeout(30, read=None)) as stream:
                lines = stream.iter_lines()
                kind = ""
                for line in lines:  # to the second text event, then stop the server
                    if line.startswith("event: "):
                        kind = line[len("event: "):]
                    elif line.startswith("data: "):
                        events.append((kind, line))
                        if sum(k == "text" for k, _ in events) == 2:
                            break
                stopped_at = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                # The rest of the stream: read to its end without an error (httpx raises
                # RemoteProtocolError on a response cut off mid-body).
                rest = list(lines)
            ended_after = time.monotonic() - stopped_at
        assert "event: done" not in rest  # the turn goes on: this process only stopped serving it
        assert rest == [] or rest[-1] == "", rest  # nothing half-written: the stream ended at an event's end
        # uvicorn ends by raising the signal it caught again, with the default handler back
        assert proc.wait(30) in (0, -signal.SIGTERM)
        log.seek(0)
        output = log.read()
        assert "ending 1 open event streams: this API process is shutting down" in output, output
        assert "timeout graceful shutdown exceeded" not in output and "Traceback" not in output, output
        assert ended_after < 10  # well before the graceful timeout (10 s) would have cut it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
