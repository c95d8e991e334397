"""Tasks of Django's task framework (the django-tasks package before Django 6.0)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

try:
    from django.tasks import TaskContext, task  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    from django_tasks import TaskContext, task

from .models import Order


@task
def add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def place_order(context: TaskContext, name: str) -> dict[str, Any]:
    order = Order.objects.create(name=name)
    return {"order": order.pk, "attempt": context.attempt, "id": context.task_result.id}


@task
async def double(value: int) -> int:
    await asyncio.sleep(0)
    return value * 2


@task
def record(name: str) -> None:
    Order.objects.create(name=name)


@task(queue_name="emails")
def fail(message: str) -> None:
    raise ValueError(message)


@task
def returns_a_set() -> set[int]:
    return {1, 2}


@task
def slow(seconds: float) -> str:
    time.sleep(seconds)  # deaf to its attempt's end
    return "done"
