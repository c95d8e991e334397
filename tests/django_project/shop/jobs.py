"""A leaseq App of the project's own (``settings.LEASEQ["APP"]``): a plain handler
whose effect and completion commit in one Django transaction."""

from __future__ import annotations

import leaseq
from leaseq.contrib.django import job_atomic

from .models import Order

app = leaseq.App()


@app.task("orders")
def create_order(job: leaseq.JobContext) -> None:
    with job_atomic(job):
        order = Order.objects.create(name=job.payload["name"])
        job.result = {"order": order.pk}
