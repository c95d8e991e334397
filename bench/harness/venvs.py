"""The peers' virtualenvs under bench/.venvs/<name>, created on first use.

Each peer gets an interpreter of its own, so that its dependencies never meet
leaseq's (.venv) and the user's dev install stays lean; the stamp records the
pinned requirements, so a changed pin rebuilds the venv.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
VENVS = BENCH / ".venvs"
REQUIREMENTS: dict[str, list[str]] = {
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]>=3.2", "psycopg-pool>=3.2"],
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg>=0.29", "psycopg[binary]>=3.2"],
    "plot": ["matplotlib>=3.8"],
}


def python_of(name: str) -> Path:
    """The interpreter of venv `name`, built (or rebuilt for a changed pin) if needed."""
    venv = VENVS / name
    python = venv / "bin" / "python"
    stamp = venv / ".requirements"
    wanted = "\n".join(REQUIREMENTS[name])
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"bench: building {venv} ({', '.join(REQUIREMENTS[name])})", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS[name]], check=True
    )
    stamp.write_text(wanted)
    return python
