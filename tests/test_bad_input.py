"""Bad input gets a clear, typed error and writes nothing."""

from __future__ import annotations

import enum
import math
import sys
import threading
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

import pytest

import leaseq
from leaseq import InvalidArgument, InvalidJob, PayloadTooLarge
from leaseq._db.errors import translated_errors

from .clients import Client, ClientConnect


def _nothing_written(client: Client) -> None:
    with client.connection() as conn:
        jobs = conn.execute(f'SELECT count(*) FROM "{client.schema}".job').fetchone()
        queues = conn.execute(f'SELECT count(*) FROM "{client.schema}".queue').fetchone()
    assert jobs == (0,)
    assert queues == (0,)


class NotJson:
    pass


class NoOffset(tzinfo):
    """A tzinfo that knows no offset: Python counts such a datetime as naive."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


def _nested(depth: int) -> Any:
    """A payload of ``depth`` lists, one in the other."""
    payload: Any = []
    for _ in range(depth - 1):
        payload = [payload]
    return payload


BAD_ENQUEUES: list[tuple[str, dict[str, Any], type[Exception]]] = [
    ("empty queue name", {"queue": ""}, InvalidJob),
    ("queue name with spaces", {"queue": "my queue"}, InvalidJob),
    ("over-long queue name", {"queue": "q" * 129}, InvalidJob),
    ("non-string queue name", {"queue": 7}, InvalidJob),
    ("NUL in queue name", {"queue": "re\x00ports"}, InvalidJob),
    ("non-JSON payload", {"payload": NotJson()}, InvalidJob),
    ("set payload", {"payload": {1, 2}}, InvalidJob),
    ("NaN payload", {"payload": {"x": math.nan}}, InvalidJob),
    ("NUL in payload value", {"payload": {"x": "a\x00b"}}, InvalidJob),
    ("NUL in payload key", {"payload": {"a\x00": 1}}, InvalidJob),
    ("lone surrogate", {"payload": {"x": "\ud800"}}, InvalidJob),
    # JSON makes every key text: jsonb would keep one of the two values.
    ("keys 1 and '1'", {"payload": {1: "a", "1": "b"}}, InvalidJob),
    ("nested keys True and 'true'", {"payload": {"x": [{True: 1, "true": 2}]}}, InvalidJob),
    ("keys None and 'null'", {"payload": {None: 1, "null": 2}}, InvalidJob),
    ("payload over 1 MiB", {"payload": "x" * (1024 * 1024 + 1)}, PayloadTooLarge),
    # The producer could encode it; every worker that claimed it crashed.
    ("payload nested 257 deep", {"payload": {"a": _nested(256)}}, InvalidJob),
    ("negative delay", {"delay": -1}, InvalidJob),
    ("infinite delay", {"delay": math.inf}, InvalidJob),
    ("NaN delay", {"delay": math.nan}, InvalidJob),
    ("absurd delay", {"delay": 10 * 365 * 24 * 3600 + 1}, InvalidJob),
    ("string delay", {"delay": "10"}, InvalidJob),
    ("naive run_at", {"run_at": datetime(2030, 1, 1)}, InvalidJob),
    (
        "run_at whose tzinfo has no offset",
        {"run_at": datetime(2030, 1, 1, tzinfo=NoOffset())},
        InvalidJob,
    ),
    ("run_at in year 9999", {"run_at": datetime(9999, 12, 31, tzinfo=UTC)}, InvalidJob),
    ("run_at in year 1", {"run_at": datetime(1, 1, 1, tzinfo=UTC)}, InvalidJob),
    ("delay too large for a float", {"delay": 10**400}, InvalidJob),
    ("timeout too large for a float", {"timeout": 10**400}, InvalidJob),
    ("unique_for too large for a float", {"unique_key": "u", "unique_for": 10**400}, InvalidJob),
    ("delay and run_at", {"delay": 1, "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, InvalidJob),
    ("over-long key", {"key": "k" * 256}, InvalidJob),
    ("empty key", {"key": ""}, InvalidJob),
    ("NUL in key", {"key": "k\x00"}, InvalidJob),
    ("seq without key", {"seq": 3}, InvalidJob),
    ("float seq", {"key": "k", "seq": 1.5}, InvalidJob),
    ("priority out of range", {"priority": 40000}, InvalidJob),
    ("zero max_attempts", {"max_attempts": 0}, InvalidJob),
    ("over-long idempotency key", {"idempotency_key": "i" * 256}, InvalidJob),
    # The job table no longer repeats these checks (migration 0010): the client
    # is what refuses them, before anything is written.
    ("max_attempts over 1000", {"max_attempts": 1001}, InvalidJob),
    ("negative max_attempts", {"max_attempts": -1}, InvalidJob),
    ("zero timeout", {"timeout": 0}, InvalidJob),
    ("negative timeout", {"timeout": -1.5}, InvalidJob),
    ("NaN timeout", {"timeout": math.nan}, InvalidJob),
    ("over-long unique key", {"unique_key": "u" * 256}, InvalidJob),
    ("negative unique_for", {"unique_key": "u", "unique_for": -1}, InvalidJob),
    ("over-long group", {"group": "g" * 256}, InvalidJob),
    ("over-long multibyte key", {"key": "é" * 128}, InvalidJob),
]

BAD_BATCHES: list[tuple[str, dict[str, Any]]] = [
    ("over-long key", {"key": "k" * 256}),
    ("max_attempts over 1000", {"max_attempts": 1001}),
    ("zero timeout", {"timeout": 0}),
    ("over-long unique key", {"unique_keys": ["u", "u" * 256]}),
    ("negative unique_for", {"unique_keys": ["u", "v"], "unique_for": -1}),
    ("delay too large for a float", {"delay": 10**400}),
    ("over-long group", {"group": "g" * 256}),
    ("seqs a generator", {"key": "k", "seqs": (n for n in (1, 2))}),
    ("seqs a string", {"key": "k", "seqs": "12"}),
    ("unique_keys a generator", {"unique_keys": (k for k in "uv")}),
    ("a unique key None", {"unique_keys": ["u", None]}),
    ("a unique key empty", {"unique_keys": ["u", ""]}),
    ("run_at in year 9999", {"run_at": datetime(9999, 12, 31, tzinfo=UTC)}),
]


@pytest.mark.parametrize(
    ("given", "error"), [(b[1], b[2]) for b in BAD_ENQUEUES], ids=[b[0] for b in BAD_ENQUEUES]
)
def test_bad_enqueue_is_refused_and_writes_nothing(
    client: Client, given: dict[str, Any], error: type[Exception]
) -> None:
    arguments: dict[str, Any] = {"queue": "reports", "payload": {"report_id": 1}, **given}
    with pytest.raises(error):
        client.enqueue(arguments.pop("queue"), arguments.pop("payload"), **arguments)
    _nothing_written(client)


@pytest.mark.parametrize("given", [b[1] for b in BAD_BATCHES], ids=[b[0] for b in BAD_BATCHES])
def test_bad_batch_is_refused_and_writes_nothing(client: Client, given: dict[str, Any]) -> None:
    with pytest.raises(InvalidJob):
        client.enqueue_many("reports", [{"n": 1}, {"n": 2}], **given)
    _nothing_written(client)


def test_bad_payload_in_a_batch_refuses_the_whole_batch(client: Client) -> None:
    with pytest.raises(InvalidJob):
        client.enqueue_many("reports", [{"ok": 1}, {"bad": "\x00"}])
    with pytest.raises(InvalidJob):
        client.enqueue_many("reports", [{"ok": 1}], key="k", seqs=[1, 2])
    _nothing_written(client)


def test_error_leaves_the_callers_transaction_usable(
    client: Client, client_connect: ClientConnect
) -> None:
    conn = client_connect()
    with conn.transaction():
        with pytest.raises(InvalidJob):
            client.enqueue("reports", {"x": "\x00"}, conn=conn)
        client.enqueue("reports", {"x": "fine"}, conn=conn)
    assert len(client.claim("reports")) == 1


def test_escaped_backslash_before_u0000_text_is_not_a_nul(client: Client) -> None:
    job_id = client.enqueue("reports", {"path": "C:\\u0000dir"})
    assert client.get(job_id).payload == {"path": "C:\\u0000dir"}


def test_keys_of_mixed_types_that_do_not_collide_are_taken_as_json_has_them(
    client: Client,
) -> None:
    job_id = client.enqueue("reports", {1: "a", "b": [{2.5: None, False: 0}], None: 1})
    assert client.get(job_id).payload == {"1": "a", "b": [{"2.5": None, "false": 0}], "null": 1}


def test_unicode_payload_round_trips(client: Client) -> None:
    payload = {"customer": "Zoë Ångström 🧾", "amounts": [1.5, -2, 10**18], "none": None}
    job_id = client.enqueue("reports", payload)
    assert client.get(job_id).payload == payload
    assert client.get(job_id).payload_bytes == len(
        '{"customer":"Zoë Ångström 🧾","amounts":[1.5,-2,1000000000000000000],"none":null}'.encode()
    )


@pytest.mark.parametrize(
    "arguments",
    [
        {"limit": 0},
        {"limit": -1},
        {"limit": 10_001},
        {"limit": 1.5},
        {"lease": 0},
        {"lease": -1},
        {"lease": math.inf},
        {"lease": 86401},
    ],
)
def test_bad_claim_arguments(client: Client, arguments: dict[str, Any]) -> None:
    client.enqueue("reports", {})
    with pytest.raises(InvalidArgument):
        client.claim("reports", **arguments)
    assert client.stats("reports")[0].counts[leaseq.JobStatus.QUEUED] == 1


def test_bad_renew_and_retry_arguments_change_nothing(client: Client) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    with pytest.raises(InvalidArgument):
        client.renew(claim, lease=-3)
    with pytest.raises(InvalidArgument):
        client.retry(claim, delay=-3)
    assert client.get(claim.job_id).status is leaseq.JobStatus.RUNNING
    for running in (["yes"], [True, False], [None]):
        with pytest.raises(InvalidArgument, match="handlers_running"):
            client.release_many([claim], handlers_running=running)  # type: ignore[list-item]
    assert client.get(claim.job_id).status is leaseq.JobStatus.RUNNING
    client.complete(claim)


#: (Made per test: a generator is spent by the first test that reads it.)
NOT_CLAIMS: dict[str, Any] = {
    "None": lambda: None,
    "an int": lambda: 7,
    "a string": lambda: "claim",
    "a list of ints": lambda: [7],
    "a list of None": lambda: [None],
    "a generator": lambda: (c for c in ()),
}


@pytest.mark.parametrize("given", list(NOT_CLAIMS), ids=str)
@pytest.mark.parametrize(
    "write",
    [
        lambda client, given: client.complete_many(given),
        lambda client, given: client.renew_many(given),
        lambda client, given: client.retry_many(given),
        lambda client, given: client.fail_many(given),
        lambda client, given: client.release_many(given),
    ],
    ids=["complete_many", "renew_many", "retry_many", "fail_many", "release_many"],
)
def test_a_fenced_batch_write_takes_only_claims(client: Client, write: Any, given: str) -> None:
    client.enqueue("reports", {})
    client.claim("reports")
    with pytest.raises(InvalidArgument):
        write(client, NOT_CLAIMS[given]())
    assert client.stats("reports")[0].counts[leaseq.JobStatus.RUNNING] == 1


@pytest.mark.parametrize(
    "write",
    [
        lambda client, given: client.complete(given),
        lambda client, given: client.renew(given),
        lambda client, given: client.retry(given),
        lambda client, given: client.fail(given),
    ],
    ids=["complete", "renew", "retry", "fail"],
)
@pytest.mark.parametrize("given", [None, 7, "claim"], ids=repr)
def test_a_fenced_write_takes_only_a_claim(client: Client, write: Any, given: Any) -> None:
    with pytest.raises(InvalidArgument):
        write(client, given)


def test_per_claim_values_must_be_lists(client: Client) -> None:
    client.enqueue("reports", {})
    claims = client.claim("reports")
    with pytest.raises(InvalidArgument, match="results"):
        client.complete_many(claims, results=(r for r in [1]))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="delays"):
        client.retry_many(claims, delays="5")  # type: ignore[arg-type]
    assert client.stats("reports")[0].counts[leaseq.JobStatus.RUNNING] == 1


@pytest.mark.parametrize("job_id", [0, -1, "7", 2**63, True])
def test_bad_job_ids(client: Client, job_id: Any) -> None:
    with pytest.raises(InvalidArgument):
        client.get(job_id)


@pytest.mark.parametrize("schema", ["Upper", "1starts_with_digit", "semi;colon", "x" * 64, ""])
def test_bad_schema_names(client_class: type[Client], database_url: str, schema: str) -> None:
    with pytest.raises(InvalidArgument):
        client_class(database_url, schema=schema)


@pytest.mark.parametrize("schema", ["pg_x", "pg_catalog", "pg_temp", "information_schema"])
def test_schema_names_postgresql_reserves(
    client_class: type[Client], database_url: str, schema: str
) -> None:
    """Refused up front, not by the server's ReservedName (a driver error) at migrate()."""
    with pytest.raises(InvalidArgument, match="reserved"):
        client_class(database_url, schema=schema)
    with pytest.raises(InvalidArgument, match="reserved"):
        leaseq.App(schema=schema)


#: Nothing listens there: a constructor that connected would fail otherwise.
NOWHERE = "postgresql://nobody@127.0.0.1:1/none"

BAD_CLIENT_OPTIONS: list[dict[str, Any]] = [
    # 0 became a 1 ms timeout, under which every call failed with StatementTimeout.
    {"statement_timeout": 0},
    {"statement_timeout": -1},
    {"statement_timeout": math.nan},
    {"statement_timeout": math.inf},
    {"statement_timeout": "5"},
    {"statement_timeout": True},
    {"connect_timeout": 0},
    {"connect_timeout": -1},
    # NaN waited for ever for a database that was down.
    {"connect_timeout": math.nan},
    {"connect_timeout": "5"},
    {"pool_size": 0},
    {"pool_size": -1},
    {"pool_size": "3"},
    {"pool_size": 2.5},
    {"connection_options": "x"},
    {"connection_options": [("application_name", "x")]},
    {"connection_options": {1: "x"}},
    # A truthy string turned notifications on.
    {"notify": "no"},
    {"notify": 0},
    {"listen": "no"},
    {"listen": None},
    {"dsn": 5},
    {"max_payload_bytes": 2**28},  # more than jsonb holds
    # Taken, then every enqueue committed its job and raised AttributeError.
    {"metrics": "registry"},
]


@pytest.mark.parametrize("option", BAD_CLIENT_OPTIONS, ids=repr)
def test_bad_client_options_are_refused_at_construction(
    client_class: type[Client], option: dict[str, Any]
) -> None:
    arguments: dict[str, Any] = {"dsn": NOWHERE, **option}
    with pytest.raises(InvalidArgument):
        client_class(arguments.pop("dsn"), **arguments)


def test_good_client_options_are_taken(client_class: type[Client]) -> None:
    client_class(
        NOWHERE,
        statement_timeout=0.0001,
        connect_timeout=1,
        pool_size=1,
        connection_options={"application_name": "mine"},
        notify=False,
    ).close()


def test_public_is_a_schema_name_like_any_other(
    client_class: type[Client], database_url: str
) -> None:
    client_class(database_url, schema="public").close()  # (not migrated: a shared database)
    assert leaseq.App(schema="public").schema == "public"


def test_unmigrated_schema_says_so(client_class: type[Client], database_url: str) -> None:
    with client_class(database_url, schema="never_migrated_here") as client:
        with pytest.raises(leaseq.NotMigrated, match="leaseq migrate"):
            client.enqueue("reports", {})
        with pytest.raises(leaseq.NotMigrated):
            client.claim("reports")


def test_error_text_is_short_and_has_no_secrets(client: Client) -> None:
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    error = ConnectionError(
        "could not reach postgresql://app:hunter2@db.internal/prod; password=hunter2 " + "x" * 5000
    )
    client.fail(claim, error)
    stored = client.get(claim.job_id).last_error or ""
    assert "hunter2" not in stored
    assert stored.startswith("ConnectionError: could not reach postgresql://app:***@db.internal")
    assert len(stored) <= 2000


def test_an_empty_unique_batch_enqueues_nothing(client: Client) -> None:
    """As an empty plain batch does; a bad unique_for is still refused."""
    with pytest.raises(InvalidJob):
        client.enqueue_many("reports", [], unique_keys=[], unique_for=-1)
    _nothing_written(client)
    assert client.enqueue_many("reports", [], unique_keys=[]) == []
    assert client.enqueue_many("reports", []) == []


@pytest.mark.parametrize("payloads", ["abc", b"ab", {"to": "a", "subject": "b"}, 5, None], ids=repr)
def test_a_batch_that_is_no_collection_of_payloads_is_refused(
    client: Client, payloads: Any
) -> None:
    """A string or a mapping is iterable: it was one job per character or key."""
    with pytest.raises(InvalidJob, match="payloads must be"):
        client.enqueue_many("reports", payloads)
    _nothing_written(client)


def test_run_at_within_ten_years_is_taken(client: Client) -> None:
    soon = datetime.now(UTC) + timedelta(days=9 * 365)
    past = datetime.now(UTC) - timedelta(days=9 * 365)  # already due: runs at once
    later = client.enqueue("reports", {}, run_at=soon)
    due = client.enqueue("reports", {}, run_at=past)
    assert [c.job_id for c in client.claim("reports", limit=2)] == [due]
    assert client.get(later).status is leaseq.JobStatus.QUEUED


def test_cancel_takes_running_as_a_flag_only(client: Client) -> None:
    """running=True ends a claim: a truthy string must not do it by accident."""
    client.enqueue("reports", {})
    (claim,) = client.claim("reports")
    for wrong in ("no", 1, None):
        with pytest.raises(InvalidArgument, match="running"):
            client.cancel(claim.job_id, running=wrong)
    assert client.get(claim.job_id).status is leaseq.JobStatus.RUNNING
    client.complete(claim)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        # Each said "batch", "job id" or "limit": another argument's name.
        (lambda c: c.prune(max_batches=0), "max_batches"),
        (lambda c: c.audit_log(before=0), "before"),
        (lambda c: c.replay_failed("reports", batch=0), "batch"),
        (lambda c: c.prune(dry_run=0), "dry_run"),
    ],
    ids=["prune max_batches", "audit_log before", "replay_failed batch", "prune dry_run"],
)
def test_a_bad_argument_is_named_in_its_error(client: Client, call: Any, name: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"^{name} must be"):
        call(client)


LONE_SURROGATE = "\ud800"


@pytest.mark.parametrize(
    "call",
    [
        lambda c, job_id: c.cancel(job_id, actor=LONE_SURROGATE),
        lambda c, job_id: c.replay(job_id, actor=LONE_SURROGATE),
        lambda c, job_id: c.configure_queue("reports", max_attempts=3, actor=LONE_SURROGATE),
        lambda c, job_id: c.find_jobs(error=LONE_SURROGATE),
        lambda c, job_id: c.find_jobs(key=LONE_SURROGATE),
        lambda c, job_id: c.find_jobs(payload={"a": LONE_SURROGATE}),
    ],
    ids=["cancel actor", "replay actor", "configure actor", "error", "key", "payload"],
)
def test_operator_text_that_is_no_unicode_is_refused(client: Client, call: Any) -> None:
    job_id = client.enqueue("reports", {"a": 1})
    with pytest.raises(InvalidArgument):
        call(client, job_id)
    assert client.get(job_id).status is leaseq.JobStatus.QUEUED
    assert client.queue_settings("reports").max_attempts != 3  # type: ignore[union-attr]


def test_a_payload_nested_past_the_servers_stack_is_bad_input_not_transient(
    queue: leaseq.Queue,
) -> None:
    """PostgreSQL refuses jsonb nested tens of thousands deep ("stack depth limit
    exceeded"): retrying cannot help, so it is no TransientError. The client's JSON
    encoder only gets that deep with a raised recursion limit, on a large stack."""
    depth = 40_000
    payload: Any = 0
    for _ in range(depth):
        payload = [payload]
    raised: list[BaseException] = []

    def enqueue() -> None:
        try:
            queue.enqueue("reports", payload)
        except BaseException as exc:  # reported to the test's thread
            raised.append(exc)

    limit, stack = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(4 * depth)
    threading.stack_size(512 * 1024 * 1024)
    try:
        thread = threading.Thread(target=enqueue)
        thread.start()
    finally:
        threading.stack_size(stack)
        sys.setrecursionlimit(limit)
    thread.join(60)
    assert len(raised) == 1, raised
    assert isinstance(raised[0], InvalidArgument), repr(raised[0])
    assert not isinstance(raised[0], leaseq.TransientError)
    # (The queue's settings row is made before the enqueue is sent, on purpose:
    # steps.enqueue. No job was written.)
    assert queue.list_jobs(leaseq.JobStatus.QUEUED) == []


class _Rank(enum.IntEnum):
    HIGH = 5
    SEQ = 7


def test_int_subclasses_are_taken_as_the_ints_they_are(client: Client) -> None:
    """A JobId (what enqueue returns) or an IntEnum as seq froze the process:
    ``x in range(-2**63, 2**63)`` walks the range for an int subclass. And a list
    mixing JobIds and ints made psycopg refuse "mixed types" (a raw DataError)."""
    first = client.enqueue("q", {}, key="k", seq=1)
    assert isinstance(first, leaseq.JobId)
    done: list[Any] = []

    def enqueue_with_subclasses() -> None:
        done.append(client.enqueue("q", {}, key="k", seq=first, priority=_Rank.HIGH))
        done.append(client.enqueue_many("q", [{}, {}], key="k2", seqs=[_Rank.SEQ, first]))

    enqueuing = threading.Thread(target=enqueue_with_subclasses, daemon=True)
    enqueuing.start()
    enqueuing.join(30)
    assert not enqueuing.is_alive(), "the enqueue froze on an int subclass"
    second, batch = done
    assert client.get(second).seq == first
    assert client.get(second).priority == 5
    assert [client.get(job_id).seq for job_id in batch] == [7, first]
    # Ids as enqueue returned them (JobId) beside plain ints, one of them large.
    a, b = client.enqueue("r", {}), client.enqueue("r", {})
    for claim in client.claim("r", limit=2):
        client.fail(claim, error="broke")
    assert isinstance(a, leaseq.JobId)
    assert sorted(client.replay_many([a, int(b), 2**40])) == sorted([a, b])


def test_a_batch_past_what_one_statement_carries_is_refused_before_it_is_sent(
    client: Client, client_connect: ClientConnect
) -> None:
    """Each payload under the cap, together over 256 MiB: PostgreSQL closed the
    connection on the message (over 1 GiB once escaped), a TransientError that
    no retry mends, and inside the caller's transaction the connection was lost."""
    payloads = [{"blob": "a" * 1_040_000}] * 260
    conn = client_connect()
    with conn.transaction():
        with pytest.raises(PayloadTooLarge, match="smaller batches"):
            client.enqueue_many("reports", payloads, conn=conn)
        client.enqueue("reports", {"x": "fine"}, conn=conn)  # the transaction goes on
    assert len(client.claim("reports", limit=10)) == 1


def test_a_size_past_postgresqls_own_limits_is_bad_input_not_transient(
    queue: leaseq.Queue,
) -> None:
    """program_limit_exceeded (54000), e.g. jsonb's "total size of jsonb array
    elements exceeds the maximum" for a payload under the cap whose numbers take
    more room as jsonb: it came out as a TransientError ("try again"), though
    sending it again fails again. (A too large array raises the same SQLSTATE
    at no cost; the payload would take gigabytes.)"""
    with (
        queue.connection() as conn,
        pytest.raises(InvalidArgument) as refused,
        translated_errors(),
    ):
        conn.execute("SELECT array_fill(0, ARRAY[200000000])")
    assert not isinstance(refused.value, leaseq.TransientError)
    assert "exceeds the maximum" in str(refused.value)


SWAPPED_ARGUMENTS: list[tuple[str, Any]] = [
    ("payload as the queue", lambda c, p: c.enqueue(p, "reports")),
    ("payload as the ordering key", lambda c, p: c.enqueue("reports", {}, key=p)),
    ("payload as the unique key", lambda c, p: c.enqueue("reports", {}, unique_key=p)),
    ("payload as the idempotency key", lambda c, p: c.enqueue("reports", {}, idempotency_key=p)),
    ("payload as the group", lambda c, p: c.enqueue("reports", {}, group=p)),
    ("payload as the delay", lambda c, p: c.enqueue("reports", {}, delay=p)),
    ("payload as a batch's queue", lambda c, p: c.enqueue_many(p, [{}])),
    ("payloads as unique keys", lambda c, p: c.enqueue_many("reports", [p], unique_keys=[p])),
]


@pytest.mark.parametrize(
    "call", [s[1] for s in SWAPPED_ARGUMENTS], ids=[s[0] for s in SWAPPED_ARGUMENTS]
)
def test_a_payload_given_in_place_of_a_name_stays_out_of_the_error(
    client: Client, call: Any
) -> None:
    """Arguments swapped by mistake: the refusal quoted the whole payload (its
    secret fields too, a megabyte of it) in its text, which ends in logs and
    error trackers. It names what it got, without the payload's values."""
    payload = {"api_key": "sk_live_51Hx9s3cr3tV4lu3", "rows": ["r" * 100] * 20}
    with pytest.raises(InvalidJob) as refused:
        call(client, payload)
    text = str(refused.value)
    assert "sk_live_51Hx9s3cr3tV4lu3" not in text
    assert len(text) < 500, len(text)
    _nothing_written(client)
