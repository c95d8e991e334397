"""Write the sync client from the async one (the way psycopg keeps its twin).

    python tools/async_to_sync.py          # write src/leaseq/_sync_client.py
    python tools/async_to_sync.py --check  # fail if it is not what this would write

The async source is the one edited by hand. The conversion is textual and
exact for that file's style: ``async def``/``await``/``async with``/``async
for`` lose their async, the async names become their sync twins, and blocks
between ``# async-only: begin`` and ``# async-only: end`` are left out. The
result is formatted with ruff, so ``--check`` compares like with like.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "leaseq" / "_async_client.py"
TARGET = ROOT / "src" / "leaseq" / "_sync_client.py"

HEADER = '''"""The producer and operator API for synchronous code: :class:`Queue`.

GENERATED from ``_async_client.py`` by ``tools/async_to_sync.py``: do not edit
this file; edit the async source and run the tool (``make lint`` checks it).
See ``_async_client.py`` for what the client does.
"""
'''

#: Whole words of the async source and their sync twins.
NAMES = {
    "AsyncQueue": "Queue",
    "AsyncDatabase": "Database",
    "AsyncConnection": "Connection",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    # (the async client uses asyncio for its sleeps only)
    "asyncio": "time",
}

ASYNC_ONLY = re.compile(r"^[ \t]*# async-only: begin\n.*?^[ \t]*# async-only: end\n", re.M | re.S)
DOCSTRING = re.compile(r'\A""".*?"""\n', re.S)


def convert(source: str) -> str:
    text = DOCSTRING.sub(HEADER, source, count=1)
    text = ASYNC_ONLY.sub("", text)
    for async_name, sync_name in NAMES.items():
        text = re.sub(rf"\b{async_name}\b", sync_name, text)
    text = re.sub(r"\basync (def|with|for) ", r"\1 ", text)
    text = re.sub(r"\bawait ", "", text)
    return format_with_ruff(text)


def format_with_ruff(text: str) -> str:
    """Drop the imports only async-only blocks used, sort the rest, and format, as
    ``make lint`` wants every file."""
    ruff = Path(sys.executable).with_name("ruff")
    program = str(ruff) if ruff.exists() else "ruff"
    stdin = f"--stdin-filename={TARGET}"
    for arguments in (
        ["check", "--quiet", "--select", "I,F401", "--fix", stdin, "-"],
        ["format", "--quiet", stdin, "-"],
    ):
        done = subprocess.run(
            [program, *arguments], input=text, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"ruff {arguments[0]} failed: {done.stderr or done.stdout}")
        text = done.stdout
    return text


def main() -> int:
    generated = convert(SOURCE.read_text(encoding="utf-8"))
    if "--check" in sys.argv[1:]:
        if not TARGET.exists() or TARGET.read_text(encoding="utf-8") != generated:
            print(
                f"{TARGET.relative_to(ROOT)} is not what tools/async_to_sync.py writes "
                "from _async_client.py: edit the async source and run the tool"
            )
            return 1
        return 0
    TARGET.write_text(generated, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
