"""`kortex ask --url` and `kortex postmortem --url` against a real `kortex api` process: a refused
question leaves no session, an interrupted ask cancels its turn, and every refusal is one line
that names the fields at fault; a URL that is not a Kortex API is said to be one in one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kortex_cli.main import app
from tests.kortex_cli.test_ask import SLOW, at_gate, finish, interrupt_after, interruptible

ROOT = Path(__file__).resolve().parents[2]


class Api:
    def __init__(self, url: str, key: str, env: dict[str, str]) -> None:
        self.url, self.key, self.env = url, key, env

    def sessions(self) -> list[str]:
        listed = httpx.get(f"{self.url}/v1/sessions", headers={"Authorization": f"Bearer {self.key}"}).json()
        return [s["id"] for s in listed["sessions"]]

    def turn(self, turn_id: str) -> dict[str, object]:
        return httpx.get(f"{self.url}/v1/turns/{turn_id}",  # type: ignore[no-any-return]
                         headers={"Authorization": f"Bearer {self.key}"}).json()

    def ask(self, *args: str) -> list[str]:
        return ["ask", *args, "--url", self.url, "--api-key", self.key]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_serving(url: str, proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    """Until the `kortex api` process ``proc`` answers its health check at ``url``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the API did not start"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    base = tmp_path_factory.mktemp("api")
    (base / "scripts").mkdir()
    (base / "scripts" / "slow.json").write_text(json.dumps(SLOW))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env.update(KORTEX_HOME=str(base / "kortex"), PYTHONPATH=str(ROOT), KORTEX_TESTING__ENABLE_TEST_PROVIDERS="true",
               KORTEX_TESTING__SCRIPTS_DIR=str(base / "scripts"), KORTEX_TURN__MAX_MESSAGE_CHARS="100")
    cli = [sys.executable, "-m", "kortex_cli.main"]
    made = subprocess.run([*cli, "admin", "create-tenant", "acme"], env=env, capture_output=True, text=True,
                          check=True, cwd=base)
    key = made.stdout.strip().splitlines()[-1]
    port = free_port()
    proc = subprocess.Popen([*cli, "api", "--port", str(port)], env=env, cwd=base,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, proc)
        yield Api(url, key, env)
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_empty_question_is_refused_before_a_session_is_made(api: Api) -> None:
    before = api.sessions()
    result = CliRunner().invoke(app, api.ask("   "))
    assert result.exit_code == 2 and "the question is empty" in result.stderr, result.output
    assert api.sessions() == before


def test_a_question_of_several_lines_is_asked_in_a_session_named_on_one_line(api: Api) -> None:
    before = set(api.sessions())
    result = CliRunner().invoke(app, api.ask("why is\n\tcheckout slow?"))
    assert result.exit_code == 0, result.output  # the server refuses a name with a line break: 422
    made = [s for s in httpx.get(f"{api.url}/v1/sessions", headers={"Authorization": f"Bearer {api.key}"}
                                 ).json()["sessions"] if s["id"] not in before]
    assert [s["name"] for s in made] == ["why is checkout slow?"]


def test_a_question_the_server_refuses_leaves_no_session_behind(api: Api) -> None:
    before = api.sessions()
    result = CliRunner().invoke(app, api.ask("why? " * 30))  # past the server's 100 characters
    assert result.exit_code == 1, result.output
    assert result.stderr == "error: HTTP 422: content: longer than 100 characters\n"
    assert api.sessions() == before


def test_a_refused_request_names_its_fields_on_one_line(api: Api) -> None:
    result = CliRunner().invoke(app, api.ask("hi", "--model", "x" * 201))
    assert result.exit_code == 1
    assert result.stderr == ("error: HTTP 422: the request is not valid: model: String should have at most "
                             "200 characters\n")
    job = CliRunner().invoke(app, ["postmortem", "run", "--since", "30d", "--max-usd", "0", "--url", api.url,
                                   "--api-key", api.key])
    assert job.exit_code == 2
    assert job.stderr == "error: HTTP 422: the request is not valid: --max-usd: Input should be greater than 0\n"


def test_the_session_is_printed_and_followed_with_session(api: Api) -> None:
    first = CliRunner().invoke(app, api.ask("hi", "--json"), catch_exceptions=False)
    assert first.exit_code == 0, first.output
    done = json.loads(first.stdout.splitlines()[-1])
    assert done["event"] == "done" and done["data"]["status"] == "done"
    session_id = done["data"]["session_id"]
    assert done["data"]["turn_id"] == json.loads(first.stdout.splitlines()[0])["data"]["turn_id"]
    again = CliRunner().invoke(app, api.ask("more?", "--session", session_id), catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert f"· session {session_id} · turn " in again.stdout


def test_ctrl_c_cancels_the_turn_at_the_server(api: Api) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kortex_cli.main", *api.ask("hi", "--model", "scripted:slow",
                                                                               "--json")],
                            env=api.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interruptible)
    lines, stderr = interrupt_after(proc, "word0")
    turn_id = json.loads(lines[0])["data"]["turn_id"]
    assert api.turn(turn_id)["status"] == "cancelled", stderr.decode()  # not left queued or running
    assert api.turn(turn_id)["session_id"] in api.sessions()  # its session holds the question: it stays
    assert proc.returncode == 130
    assert f"cancelled turn {turn_id} (interrupted)" in stderr.decode()


# --- Ctrl-C before the turn streams: a proxy in front of the API holds one request --------------

class Hold:
    """A request the proxy holds until the test releases it: ``drop``, never passed on (the
    server never hears of it); ``before`` passing it on; ``after``, the server's answer kept
    from the client."""

    def __init__(self, method: str, path_end: str, when: str) -> None:
        self.method, self.path_end, self.when = method, path_end, when
        self.taken = False
        self.reached, self.released = threading.Event(), threading.Event()  # reached: the request waits
        self.answer: dict[str, Any] | None = None

    def wait(self) -> None:
        assert self.reached.wait(60), f"no {self.method} ...{self.path_end} reached the proxy"


class Proxy(ThreadingHTTPServer):
    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = upstream
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.holds: list[Hold] = []
        self.answered: list[tuple[str, str, int, bytes]] = []  # method, path, status, body
        self._lock = threading.Lock()

    def hold(self, method: str, path_end: str, when: str) -> Hold:
        held = Hold(method, path_end, when)
        self.holds.append(held)
        return held

    def take(self, method: str, path: str) -> Hold | None:
        with self._lock:
            for held in self.holds:
                if not held.taken and held.method == method and path.endswith(held.path_end):
                    held.taken = True
                    return held
        return None


class _Forward(BaseHTTPRequestHandler):
    server: Proxy

    def _forward(self) -> None:
        proxy = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        held = proxy.take(self.command, self.path)
        if held is not None and held.when != "after":
            held.reached.set()
            held.released.wait(60)
            if held.when == "drop":
                return
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() in ("authorization", "content-type", "idempotency-key", "accept")}
        answer = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers, timeout=60)
        if held is not None and held.when == "after":
            held.answer = answer.json()
            held.reached.set()
            held.released.wait(60)
        proxy.answered.append((self.command, self.path, answer.status_code, answer.content))
        try:
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)
        except OSError:  # the client left
            pass

    do_GET = do_POST = do_DELETE = _forward

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy(api: Api) -> Iterator[Proxy]:
    server = Proxy(api.url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        for held in server.holds:
            held.released.set()
        server.shutdown()
        server.server_close()


def ask_through(proxy: Proxy, api: Api) -> subprocess.Popen[bytes]:
    args = ["ask", "hi", "--model", "scripted:slow", "--url", proxy.url, "--api-key", api.key]
    return subprocess.Popen([sys.executable, "-m", "kortex_cli.main", *args], env=api.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=interruptible)


def interrupt_at(proc: subprocess.Popen[bytes], *holds: Hold) -> str:
    """Ctrl-C as the command waits at each hold in turn (releasing each but the first as it is
    interrupted there); what it wrote on stderr."""
    try:
        for n, held in enumerate(holds):
            held.wait()
            proc.send_signal(signal.SIGINT)
            if n:
                held.released.set()
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return stderr.decode()


def test_ctrl_c_while_the_session_is_made_exits_130_and_asks_nothing(api: Api, proxy: Proxy) -> None:
    before = api.sessions()
    stderr = interrupt_at(ask_through(proxy, api), proxy.hold("POST", "/v1/sessions", "drop"))
    assert stderr == "stopped before the question was asked (interrupted)\n"  # not "Aborted!"
    assert api.sessions() == before


def test_ctrl_c_once_the_server_made_the_session_deletes_it(api: Api, proxy: Proxy) -> None:
    """The API made the session; its answer, the session's id, had not reached the command:
    asked again under the same Idempotency-Key, the API names it, and it goes."""
    before = api.sessions()
    made = proxy.hold("POST", "/v1/sessions", "after")
    proc = ask_through(proxy, api)
    stderr = interrupt_at(proc, made)
    assert made.answer is not None and made.answer["id"] not in before  # the server did make one
    assert proc.returncode == 130, stderr
    assert stderr == "stopped before the question was asked (interrupted)\n"
    assert api.sessions() == before
    creations = [(status, json.loads(body)["id"]) for method, path, status, body in proxy.answered
                 if method == "POST" and path.endswith("/v1/sessions")]
    assert creations == [(201, made.answer["id"])]  # the second ask replayed the first: no other session


def turns_made(proxy: Proxy, posted: Hold) -> set[str]:
    """Every turn the API answered a post of the question with (the held answer too)."""
    made = {json.loads(body)["turn_id"] for method, path, status, body in proxy.answered
            if method == "POST" and path.endswith("/messages") and status == 202}
    return made | ({posted.answer["turn_id"]} if posted.answer is not None else set())


def test_ctrl_c_once_the_server_took_the_question_cancels_its_turn(api: Api, proxy: Proxy) -> None:
    """The API made the turn; its answer, the turn's id, had not reached the command."""
    posted = proxy.hold("POST", "/messages", "after")
    proc = ask_through(proxy, api)
    stderr = interrupt_at(proc, posted)
    [turn_id] = turns_made(proxy, posted)  # one turn, however many times the question went
    assert api.turn(turn_id)["status"] == "cancelled", stderr  # not left to run
    assert api.turn(turn_id)["session_id"] in api.sessions()  # a session with a turn is not deleted
    assert proc.returncode == 130
    assert stderr == f"cancelled turn {turn_id} (interrupted)\n"


def test_ctrl_c_as_the_question_goes_leaves_no_turn_running(api: Api, proxy: Proxy) -> None:
    """The API never had the question, which the command cannot know: whatever it asked is
    cancelled, and it says so."""
    posted = proxy.hold("POST", "/messages", "drop")
    proc = ask_through(proxy, api)
    stderr = interrupt_at(proc, posted)
    made = turns_made(proxy, posted)
    assert [api.turn(t)["status"] for t in made] == ["cancelled"] * len(made), stderr
    assert proc.returncode == 130
    assert stderr in {f"cancelled turn {t} (interrupted)\n" for t in made} | {
        "stopped before the question was asked (interrupted)\n"}


def gated_ask(api: Api, url: str, gate: str, when: str) -> subprocess.Popen[bytes]:
    """``ask --url`` waiting at ``gate`` (tests/kortex_cli/gated_cli.py) until its stdin closes."""
    args = ["ask", "hi", "--model", "scripted:slow", "--url", url, "--api-key", api.key]
    return subprocess.Popen([sys.executable, "-m", "tests.kortex_cli.gated_cli", gate, when, "1", "--", *args],
                            env=api.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=interruptible)


def _interrupted_at(api: Api, gate: str, when: str, at_the_gate: Callable[[], None] = lambda: None
                    ) -> tuple[int, str]:
    """``ask --url`` stopped with one SIGINT at ``gate``: its exit code and what it said."""
    proc, stderr = gated_ask(api, api.url, gate, when), b""
    try:
        stderr = at_gate(proc)
        at_the_gate()
        proc.send_signal(signal.SIGINT)
    finally:
        said = finish(proc, stderr)
    return proc.returncode, said


@pytest.mark.parametrize(("gate", "when"), [
    ("kortex_cli.remote:RemoteClient.question", "before"),  # the session made, the question not yet posted
    ("kortex_cli.remote:Question.post", "before"),  # nothing of the post has left the process
])
def test_ctrl_c_before_the_question_is_posted_deletes_the_session_made_for_it(api: Api, gate: str,
                                                                               when: str) -> None:
    """Left, it was an empty session named after the question in every listing."""
    before = api.sessions()
    returncode, said = _interrupted_at(api, gate, when)
    assert returncode == 130, said
    assert said == "stopped before the question was asked (interrupted)"
    assert api.sessions() == before


def test_ctrl_c_before_the_session_s_answer_is_read_deletes_the_session(api: Api) -> None:
    """Stopped with the server's answer in hand but not read (the first answer the command
    checks is the session's): the session is found again by its key and deleted."""
    before = api.sessions()

    def made() -> None:
        assert len(api.sessions()) == len(before) + 1  # the server made it

    returncode, said = _interrupted_at(api, "kortex_cli.remote:RemoteClient._check", "before", made)
    assert returncode == 130, said
    assert said == "stopped before the question was asked (interrupted)"
    assert api.sessions() == before


def test_ctrl_c_once_the_post_made_its_turn_cancels_it_and_keeps_the_session(api: Api) -> None:
    """The post landed, its answer did not reach the command: the session holds a turn."""
    before = set(api.sessions())
    proc, stderr = gated_ask(api, api.url, "kortex_cli.remote:Question.post", "after"), b""
    try:
        stderr = at_gate(proc)
        proc.send_signal(signal.SIGINT)
    finally:
        said = finish(proc, stderr)
    [session_id] = set(api.sessions()) - before
    assert proc.returncode == 130, said
    [turn_id] = [line.split()[2] for line in said.splitlines() if line.startswith("cancelled turn ")]
    assert said == f"cancelled turn {turn_id} (interrupted)"
    assert api.turn(turn_id)["status"] == "cancelled" and api.turn(turn_id)["session_id"] == session_id


def test_a_second_ctrl_c_while_the_unused_session_is_deleted_is_ignored(api: Api, proxy: Proxy) -> None:
    before = api.sessions()
    deleting = proxy.hold("DELETE", "", "before")
    proc, stderr = gated_ask(api, proxy.url, "kortex_cli.remote:Question.post", "before"), b""
    try:
        stderr = at_gate(proc)
        proc.send_signal(signal.SIGINT)
        deleting.wait()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None  # the command still waits for the delete: it was not cut short
        deleting.released.set()
    finally:
        said = finish(proc, stderr)
    assert proc.returncode == 130, said
    assert said == "stopped before the question was asked (interrupted)"
    assert api.sessions() == before


def test_a_second_ctrl_c_while_the_turn_is_cancelled_is_ignored(api: Api, proxy: Proxy) -> None:
    posted = proxy.hold("POST", "/messages", "after")
    cancelling = proxy.hold("POST", "/cancel", "before")
    proc = ask_through(proxy, api)
    stderr = interrupt_at(proc, posted, cancelling)
    assert posted.answer is not None
    turn_id = posted.answer["turn_id"]
    assert api.turn(turn_id)["status"] == "cancelled", stderr
    assert proc.returncode == 130
    assert stderr == f"cancelled turn {turn_id} (interrupted)\n"


class _NotKortex(BaseHTTPRequestHandler):
    def _html(self) -> None:
        body = b"<html>\n<head><title>Welcome</title></head>\n<body>\n<p>Some other site.</p>\n</body>\n</html>\n" * 4
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _html

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_kortex() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotKortex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("args", [["ask", "hi"], ["postmortem", "run", "--since", "30d"], ["models"]])
def test_a_url_that_is_not_a_kortex_api_is_said_to_be_so_in_one_line(not_kortex: str, args: list[str]) -> None:
    result = CliRunner().invoke(app, [*args, "--url", not_kortex, "--api-key", "kx_x"])
    assert result.exit_code == 1
    assert result.stderr == "error: not a Kortex API (HTTP 404, text/html): is --url the API's address?\n"
    assert result.stdout == ""


@pytest.mark.parametrize("args", [["ask", "hi"], ["postmortem", "run", "--since", "30d"]])
def test_url_without_a_key_is_a_usage_error(args: list[str]) -> None:
    result = CliRunner().invoke(app, [*args, "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and result.stdout == ""
    assert "--api-key (or KORTEX_API_KEY) is required with --url" in result.stderr


def test_a_key_revoked_with_the_cli_stops_working_on_the_embedded_api_within_seconds(api: Api) -> None:
    cli = [sys.executable, "-m", "kortex_cli.main", "admin"]
    base = Path(api.env["KORTEX_HOME"]).parent
    made = subprocess.run([*cli, "create-key", "acme"], env=api.env, capture_output=True, text=True, check=True,
                          cwd=base)
    key = made.stdout.strip()
    headers = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{api.url}/v1/tools", headers=headers).status_code == 200  # verified and cached
    subprocess.run([*cli, "revoke-key", "acme", key.split("_")[1]], env=api.env, capture_output=True, check=True,
                   cwd=base)
    start = time.monotonic()
    while httpx.get(f"{api.url}/v1/tools", headers=headers).status_code != 401:
        assert time.monotonic() - start < 5, "the revoked key still works (the cache holds keys for 30 s)"
        time.sleep(0.1)


def test_a_turn_that_shows_nothing_for_a_while_is_said_to_wait_in_the_queue_once() -> None:
    from kortex_cli.runner import hint_if_quiet

    said: list[float] = []

    def slow() -> Iterator[str]:
        time.sleep(0.6)  # no worker took the turn for a while
        yield "turn"
        time.sleep(0.6)  # a pause later in the answer is no queue
        yield "done"

    assert list(hint_if_quiet(slow(), 0.2, said.append)) == ["turn", "done"]
    assert said == [0.2]

    said.clear()
    assert list(hint_if_quiet(iter(["turn", "done"]), 0.2, said.append)) == ["turn", "done"]
    time.sleep(0.4)
    assert said == []  # the first event came in time: nothing is said, then or later


def test_a_post_mortem_jobs_status_is_asked_again_while_the_api_answers_503(capsys: pytest.CaptureFixture[str]) -> None:
    """`kortex postmortem run --url` polls the job; an API restarting behind a proxy (503) or
    for a moment unreachable exited it 1 while the job went on at the server."""
    from kortex_cli.postmortem import RemoteJobs

    answers = [503, 502, 200]

    class Restarting(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status = answers.pop(0) if answers else 200
            body = json.dumps({"error": {"code": "unavailable", "message": "restarting"}} if status != 200
                              else {"job_id": "j1", "finished_at": None}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Restarting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        jobs = RemoteJobs(f"http://127.0.0.1:{server.server_address[1]}", "kx_key")
        assert jobs.status("j1") == {"job_id": "j1", "finished_at": None}
        assert answers == []  # asked three times
        assert jobs.status("j1")["job_id"] == "j1"
    finally:
        server.shutdown()
        server.server_close()
    assert capsys.readouterr().err.count("! the API did not answer (HTTP 503); asking again") == 1
