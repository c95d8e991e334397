"""Deterministic synthetic sales data and the report built from it (real CPU work)."""

from __future__ import annotations

import hashlib
import html
import random
from dataclasses import dataclass

REGIONS = ("North", "South", "East", "West", "Central")
PRODUCTS = ("widgets", "gadgets", "gizmos", "doohickeys", "sprockets", "thingamajigs")


@dataclass(frozen=True)
class Report:
    customer: str
    period: str
    table: dict[str, dict[str, float]]  # region -> product -> revenue
    total: float

    def by_region(self) -> dict[str, float]:
        return {region: sum(row.values()) for region, row in self.table.items()}


def build(customer: str, period: str, orders: int = 60_000) -> Report:
    """Aggregate ``orders`` synthetic orders; the same inputs give the same report."""
    seed = int.from_bytes(hashlib.sha256(f"{customer}/{period}".encode()).digest()[:8], "big")
    rng = random.Random(seed)
    table = {region: dict.fromkeys(PRODUCTS, 0.0) for region in REGIONS}
    for _ in range(orders):
        region = REGIONS[rng.randrange(len(REGIONS))]
        product = PRODUCTS[rng.randrange(len(PRODUCTS))]
        quantity = 1 + int(rng.expovariate(0.3))
        table[region][product] += quantity * round(rng.uniform(2.0, 40.0), 2)
    total = round(sum(sum(row.values()) for row in table.values()), 2)
    return Report(customer, period, table, total)


def to_html(report: Report) -> str:
    """A self-contained page: a table and an SVG bar chart of revenue by region."""
    head = "".join(f"<th>{html.escape(p)}</th>" for p in PRODUCTS)
    rows = "".join(
        f"<tr><th>{html.escape(region)}</th>"
        + "".join(f"<td>{value:,.2f}</td>" for value in row.values())
        + "</tr>"
        for region, row in report.table.items()
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Sales report</title></head>"
        f"<body><h1>Sales report: {html.escape(report.customer)}, {html.escape(report.period)}"
        f"</h1><p>Total revenue: {report.total:,.2f}</p>{_chart(report)}"
        f"<table border='1'><tr><th>region</th>{head}</tr>{rows}</table></body></html>"
    )


def _chart(report: Report, width: int = 480, bar: int = 28) -> str:
    regions = report.by_region()
    top = max(regions.values()) or 1.0
    bars = "".join(
        f"<rect x='110' y='{i * (bar + 6)}' width='{value / top * (width - 120):.1f}' "
        f"height='{bar}' fill='#4a7bd0'/><text x='0' y='{i * (bar + 6) + bar * 0.7:.0f}'>"
        f"{html.escape(region)}</text>"
        for i, (region, value) in enumerate(regions.items())
    )
    height = len(regions) * (bar + 6)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"role='img' aria-label='revenue by region'>{bars}</svg>"
    )
