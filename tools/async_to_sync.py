"""Write the sync client from the async one (the way psycopg keeps its twin).

    python tools/async_to_sync.py          # write the sync files
    python tools/async_to_sync.py --check  # fail if one is not what this would write

The client is two async sources, each with its sync twin: ``_async_client.py``
(producers and workers) -> ``_sync_client.py`` and ``_async_operators.py``
(the operators' calls, a base class of the client) -> ``_sync_operators.py``.
The async sources are the ones edited by hand. The conversion is textual and
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
PACKAGE = ROOT / "src" / "leaseq"
#: Each async source and its generated twin, with the twin's first docstring line.
PAIRS = (
    ("_async_client.py", "_sync_client.py", "The producer and worker API for synchronous code"),
    ("_async_operators.py", "_sync_operators.py", "The operators' calls for synchronous code"),
)

HEADER = '''"""{title}.

GENERATED from ``{source}`` by ``tools/async_to_sync.py``: do not edit
this file; edit the async source and run the tool (``make lint`` checks it).
See ``{source}`` for what it does.
"""
'''

#: Whole words of the async source and their sync twins.
NAMES = {
    "AsyncQueue": "Queue",
    "AsyncOperatorCalls": "OperatorCalls",
    "_async_operators": "_sync_operators",
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


def convert(source: str, name: str, title: str, target: Path) -> str:
    text = ASYNC_ONLY.sub("", source)
    for async_name, sync_name in NAMES.items():
        text = re.sub(rf"\b{async_name}\b", sync_name, text)
    text = re.sub(r"\basync (def|with|for) ", r"\1 ", text)
    text = re.sub(r"\bawait ", "", text)
    # The header last: it names the async source, which the renames would change.
    header = HEADER.format(title=title, source=name)
    text = DOCSTRING.sub(lambda _: header, text, count=1)
    return format_with_ruff(text, target)


def format_with_ruff(text: str, target: Path) -> str:
    """Drop the imports only async-only blocks used, sort the rest, and format, as
    ``make lint`` wants every file."""
    ruff = Path(sys.executable).with_name("ruff")
    program = str(ruff) if ruff.exists() else "ruff"
    stdin = f"--stdin-filename={target}"
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
    stale = []
    for source, twin, title in PAIRS:
        target = PACKAGE / twin
        generated = convert((PACKAGE / source).read_text(encoding="utf-8"), source, title, target)
        if "--check" not in sys.argv[1:]:
            target.write_text(generated, encoding="utf-8")
        elif not target.exists() or target.read_text(encoding="utf-8") != generated:
            stale.append(
                f"{target.relative_to(ROOT)} is not what tools/async_to_sync.py writes "
                f"from {source}: edit the async source and run the tool"
            )
    for message in stale:
        print(message)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
