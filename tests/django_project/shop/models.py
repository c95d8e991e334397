from __future__ import annotations

from django.db import models


class Order(models.Model):  # type: ignore[misc]  # Django has no inline types
    name = models.CharField(max_length=100)

    class Meta:
        app_label = "shop"
