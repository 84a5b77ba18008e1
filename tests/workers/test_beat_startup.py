"""``kortex beat`` stops before it starts anything when it cannot serve the metrics it was asked
for (the command checks the port first; this is the race where another process takes it
between the check and the bind): one line naming the option, not a bare OSError."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from kortex import metrics
from kortex.errors import ConfigError
from tests.conftest import make_settings
from workers import beat, runtime


def test_beat_refuses_a_metrics_port_it_cannot_bind(tmp_path: Path, sqlite_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def taken(port: int, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))

    started: list[object] = []
    monkeypatch.setattr(metrics, "serve", taken)
    monkeypatch.setattr(runtime, "kortex", lambda settings: started.append(settings))
    settings = make_settings(tmp_path, sqlite_url)
    raised: list[BaseException] = []

    def run() -> None:  # off the main thread: beat would install its signal handlers in pytest's
        try:
            beat.run(settings, stop=threading.Event(), metrics_port=19999)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], ConfigError), raised
    assert str(raised[0]) == "cannot serve metrics on --metrics-port 19999: Address already in use"
    assert started == []  # the container (database, Redis) was never built
