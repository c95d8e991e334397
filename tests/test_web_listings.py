"""What the pages list and link: a Failed group's jobs are exactly that group's,
a page that leaves groups or keys out says so, the Overview counts every shown
queue's blocked keys, a queue named "." or ".." has its pages, and create_app
refuses limits the library would refuse on every use."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import urljoin, urlsplit

import pytest

import leaseq

from .test_web_fixtures import BASE, AppFactory, Browser, browser, jobs, make_app, text_of

__all__ = ["browser", "jobs", "make_app"]  # fixtures, used by name


def _form_fields(page: str, action: str) -> dict[str, str]:
    """The hidden fields of the page's (first) form posting to ``action``."""
    form = re.search(rf'<form method="post" action="{re.escape(action)}".*?</form>', page, re.S)
    assert form is not None, f"no form posting to {action}"
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form[0])
    return {name: unescape(value) for name, value in fields}


def _failed(queue: leaseq.Queue, name: str, count: int, error: str | None) -> list[int]:
    """``count`` jobs of queue ``name`` that failed with ``error``."""
    ids = queue.enqueue_many(name, [{"n": n} for n in range(count)], max_attempts=1)
    for claim in queue.claim(name, limit=count):
        queue.fail(claim, error)
    return ids


# -- Failed: a group's "Show jobs" --------------------------------------------------------


async def test_a_failed_groups_show_jobs_lists_only_that_groups_jobs(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """docs/dashboard.md: the Failed page has "a link to the jobs of each group".
    The link searched the group's text as a case-insensitive substring: the jobs
    of the group "boom" came with those of "BOOM" and "kaboom" (other groups of
    the same page), and the Jobs page's "Replay failed jobs matching this
    filter…" then offered all of them."""
    boom = _failed(queue, "work", 2, "boom")
    _failed(queue, "work", 1, "kaboom")
    _failed(queue, "work", 1, "BOOM")
    page = (await browser.get("/failed")).text
    rows = [row for row in re.findall(r"<tr>(.*?)</tr>", page, re.S) if "Show jobs" in row]
    (row,) = [r for r in rows if re.search(r'<td class="error-text">\s*boom\s*</td>', r)]
    link = re.search(r'href="(/jobs\?[^"]*)"[^>]*>Show jobs<', row)
    assert link is not None
    listed = (await browser.get(unescape(link[1]))).text
    shown = {int(i) for i in re.findall(r'href="/jobs/(\d+)"', listed)}
    assert shown == set(boom)
    # And the bulk replay that page offers takes that group only.
    fields = _form_fields(listed, "/replay")
    confirm = (await browser.post("/replay", fields)).text
    ids = re.search(r'name="ids" value="([^"]*)"', confirm)
    assert ids is not None
    assert {int(i) for i in ids[1].split(",") if i} == set(boom)


# -- Failed and Blocked keys: what the pages leave out -------------------------------------


async def test_the_failed_page_says_when_it_leaves_groups_out(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """The Failed page lists the 50 largest groups only; with more, the others were
    left out without a word (its note counts every failed job read, so the
    listed groups did not add up to it, and nothing said why)."""
    ids = queue.enqueue_many("work", [{"n": n} for n in range(51)], max_attempts=1)
    for claim in queue.claim("work", limit=51):
        queue.fail(claim, f"error number {claim.job_id}")
    page = (await browser.get("/failed")).text
    listed = re.findall(r'<td class="num">1</td>', page)
    assert len(listed) == 50
    text = text_of(page)
    assert "Grouped over 51 failed jobs" in text
    assert "50 largest groups" in text, "the page did not say that groups were left out"
    assert len(ids) == 51


async def test_the_blocked_keys_page_says_when_it_leaves_keys_out(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """The Blocked keys page lists 100 keys at most; with more (the Overview says
    "100+"), it said nothing of the others."""
    queue.configure_queue("mail", ordering_policy="block")
    count = 101
    for n in range(count):
        queue.enqueue_many("mail", [{"n": 1}, {"n": 2}], key=f"k{n}", seqs=[1, 2], max_attempts=1)
    heads = queue.claim("mail", limit=count)
    assert len(heads) == count
    for claim in heads:
        queue.fail(claim, "smtp refused")
    overview = text_of((await browser.get("/")).text)
    assert "100+ held by a failed head" in overview
    page = (await browser.get("/blocked")).text
    assert len(re.findall(r'action="/jobs/\d+/skip"', page)) == 100
    assert "first 100" in text_of(page), "the page did not say that keys were left out"


# -- Queues whose name is a dot segment --------------------------------------------------------


@pytest.mark.parametrize("name", [".", ".."])
async def test_a_queue_named_like_a_dot_segment_has_a_settings_page(
    browser: Browser, queue: leaseq.Queue, name: str
) -> None:
    """Queue names may be "." and "..". Their Settings link and Pause form were
    /queues/. and /queues/..: a browser resolves those dot segments (percent-
    encoded ones too) before asking, to /queues/ and /: the queue's settings page
    and its pause button were out of reach."""
    queue.enqueue(name, {"n": 1})
    page = (await browser.get("/")).text
    card = re.search(rf'aria-label="Queue {re.escape(name)}">(.*?)</section>', page, re.S)
    assert card is not None
    link = re.search(r'<a class="button" href="([^"]+)">Settings</a>', card[1])
    assert link is not None
    # As a browser resolves it: dot segments removed.
    target = urlsplit(urljoin(BASE + "/", unescape(link[1])))
    settings = await browser.get(target.path + (f"?{target.query}" if target.query else ""))
    assert settings.status_code == 200
    assert f"<h1>Queue {name} " in settings.text
    pause = re.search(r'<form method="post" action="([^"]+)"', card[1])
    assert pause is not None
    action = urlsplit(urljoin(BASE + "/", unescape(pause[1])))
    fields = _form_fields(card[1], pause[1])
    response = await browser.post(
        action.path + (f"?{action.query}" if action.query else ""), fields
    )
    assert response.status_code == 303, response.status_code
    settings_now = queue.queue_settings(name)
    assert settings_now is not None
    assert settings_now.paused


# -- create_app: limits the library refuses on every use ----------------------------------


@pytest.mark.parametrize(
    ("option", "value"), [("bulk_limit", 10_001), ("search_window", 10_000_001)]
)
def test_create_app_refuses_limits_the_library_refuses_on_every_use(
    make_app: AppFactory, option: str, value: int
) -> None:
    """``create_app`` checked only that ``bulk_limit`` and ``search_window`` are
    positive. Past what the library takes (replay_many: 10,000 ids; find_jobs: a
    window of 10,000,000) the app started, and then every Jobs search (a 400:
    "window must be an integer in [1, 10000000]") or every confirmed bulk replay
    of more than 10,000 jobs (after a confirmation page that offered them: a 400,
    "at most 10000 job ids per call") failed."""
    with pytest.raises(leaseq.InvalidArgument, match=option):
        make_app(**{option: value})
    make_app(**{option: value - 1})  # the largest the library takes is fine


async def test_the_overview_counts_the_blocked_keys_of_every_queue_it_shows(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """The Overview counted each queue's blocked keys among the newest 100 of all
    queues: with 100 newer ones in another queue, a queue with keys held by a
    failed head showed none at all (its card had no "Blocked keys" line)."""
    for name in ("quiet", "busy"):
        queue.configure_queue(name, ordering_policy="block")
    for name, count in (("quiet", 2), ("busy", 101)):  # quiet's failures are the older
        for n in range(count):
            queue.enqueue_many(name, [{"n": 1}, {"n": 2}], key=f"k{n}", seqs=[1, 2], max_attempts=1)
        for claim in queue.claim(name, limit=count):
            queue.fail(claim, "smtp refused")
    page = (await browser.get("/")).text
    quiet = re.search(r'aria-label="Queue quiet">(.*?)</section>', page, re.S)
    busy = re.search(r'aria-label="Queue busy">(.*?)</section>', page, re.S)
    assert quiet is not None
    assert busy is not None
    assert "100+ held by a failed head" in text_of(busy[1])
    assert "Blocked keys 2 held by a failed head" in text_of(quiet[1])


# -- An ordering key is matched exactly ---------------------------------------------------


async def test_a_keys_links_list_its_jobs_when_it_starts_or_ends_with_spaces(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """Ordering keys match exactly, and " cust-1 " is a valid key: the Jobs page
    stripped its key filter, so the key's own links (on the Blocked keys page, on
    its jobs' pages) listed none of its jobs, and a bulk replay filtered by it
    found none."""
    queue.configure_queue("a", max_attempts=1, ordering_policy="block")
    head, waiting = queue.enqueue_many("a", [{"n": 1}, {"n": 2}], key=" cust-1 ", seqs=[1, 2])
    (claim,) = queue.claim("a")
    queue.fail(claim, "boom")
    queue.enqueue("a", {"n": 3}, key="cust-1")  # another key: never listed with it
    blocked = (await browser.get("/blocked")).text
    on_job = (await browser.get(f"/jobs/{waiting}")).text
    for page in (blocked, on_job):
        link = re.search(r'<a href="(/jobs\?queue=a&amp;key=[^"]*)"', page)
        assert link is not None
        listed = (await browser.get(unescape(link[1]))).text
        assert {int(i) for i in re.findall(r'href="/jobs/(\d+)">#', listed)} == {head, waiting}
    confirm = (await browser.post("/replay", {"queue": "a", "key": " cust-1 "})).text
    ids = re.search(r'name="ids" value="([^"]*)"', confirm)
    assert ids is not None, text_of(confirm)
    assert ids[1] == str(head)


def _as_a_browser_sends(value: str) -> str:
    """A hidden field's value as a browser submits it: its HTML parser reads CRLF and
    CR as LF, and the form's submission sends every line break as CRLF."""
    return value.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\r\n")


async def test_a_bulk_replay_from_the_jobs_of_a_key_with_a_line_break_takes_that_keys_only(
    browser: Browser, queue: leaseq.Queue
) -> None:
    """An ordering key may hold line breaks ("a\\nb" and "a\\r\\nb" are two keys). The
    Jobs page of one sent its key back in a hidden field, which a browser returns
    with its line breaks as CRLF: the bulk replay it offered confirmed the failed
    jobs of the other key, never listed on that page."""
    keys: dict[str, list[int]] = {"a\nb": [], "a\r\nb": [], "a\rb": []}
    for key in keys:
        keys[key] = queue.enqueue_many("work", [{"n": 1}], key=key, max_attempts=1)
    keys["ab"] = queue.enqueue_many("work", [{"n": 1}], key="ab", max_attempts=1)
    for claim in queue.claim("work", limit=10):
        queue.fail(claim, "boom")
    for key, ids in keys.items():
        listed = (
            await browser.get("/jobs", params={"queue": "work", "state": "failed", "key": key})
        ).text
        assert {int(i) for i in re.findall(r'href="/jobs/(\d+)">#', listed)} == set(ids)
        fields = _form_fields(listed, "/replay")
        sent = {name: _as_a_browser_sends(value) for name, value in fields.items()}
        confirm = (await browser.post("/replay", sent)).text
        found = re.search(r'name="ids" value="([^"]*)"', confirm)
        assert found is not None, text_of(confirm)
        assert {int(i) for i in found[1].split(",") if i} == set(ids), repr(key)
