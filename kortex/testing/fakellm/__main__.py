"""``python -m kortex.testing.fakellm --scripts DIR [--port N]``: serve scripts from a folder
(one ``<model>.json`` per model) until interrupted. Prints ``listening on <url>`` when ready."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from kortex.testing.fakellm.script import FakeScript
from kortex.testing.fakellm.server import FakeLLM


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kortex.testing.fakellm", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--scripts", type=Path, action="append", default=[], help="folder of <model>.json scripts")
    parser.add_argument("--default", help="script for models without their own")
    args = parser.parse_args(argv)
    scripts = {p.stem: FakeScript.model_validate_json(p.read_text()) for folder in args.scripts
               for p in sorted(folder.glob("*.json"))}
    fake = FakeLLM(scripts, default=args.default, host=args.host, port=args.port)

    async def run() -> None:
        await fake.start_async()
        print(f"listening on {fake.url}", flush=True)
        await fake.serve_forever()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
