"""The report-generation demo: a Starlette service and leaseq workers.

`leaseq demo` (behind `make demo`) runs it. Needs the `demo` extra
(starlette, uvicorn, httpx).
"""

import os

#: The demo's own schema (leaseq's tables and the demo's), reset on every run.
SCHEMA = os.environ.get("LEASEQ_DEMO_SCHEMA", "leaseq_demo")
QUEUE = "reports"
