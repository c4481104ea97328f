"""Scattered-change code edits for draft benchmarks: realistic 40–80-line Python sources
and instructions whose answer is the whole source with changes all over it (a rename
through a function, a changed signature with its callers, inserted blocks, reformatting),
where n-gram matches break at every changed identifier.

``EDITS`` lists (kind, source, instruction); ``messages(edit)`` is the chat request.
"""

from __future__ import annotations

from dataclasses import dataclass

# the report-building part of the function bench/drafting.py edits too
ORDERS_REPORT = '''def summarize_orders(orders, currency="EUR", include_refunds=False):
    """Aggregate a list of order dicts into per-customer totals."""
    totals = {}
    counts = {}
    refunds = {}
    skipped = 0
    for order in orders:
        customer = order.get("customer")
        if customer is None:
            skipped += 1
            continue
        amount = order.get("amount", 0.0)
        if order.get("currency", currency) != currency:
            rate = order.get("rate")
            if rate is None:
                skipped += 1
                continue
            amount = amount * rate
        status = order.get("status", "paid")
        if status == "refunded":
            refunds[customer] = refunds.get(customer, 0.0) + amount
            if not include_refunds:
                continue
            amount = -amount
        elif status == "cancelled":
            skipped += 1
            continue
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
    report = []
    for customer in sorted(totals):
        total = round(totals[customer], 2)
        count = counts[customer]
        average = round(total / count, 2) if count else 0.0
        refunded = round(refunds.get(customer, 0.0), 2)
        report.append({
            "customer": customer,
            "total": total,
            "orders": count,
            "average": average,
            "refunded": refunded,
            "currency": currency,
        })
'''
ORDERS = ORDERS_REPORT + '''    summary = {
        "customers": len(report),
        "skipped": skipped,
        "grand_total": round(sum(row["total"] for row in report), 2),
    }
    return {"rows": report, "summary": summary}
'''

INVENTORY = '''import logging

log = logging.getLogger(__name__)


def load_stock(path, warehouse):
    stock = {}
    with open(path) as handle:
        for line_number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(",")
            if len(parts) != 3:
                log.warning("bad line %d in %s", line_number, path)
                continue
            sku, name, quantity = parts
            stock[sku] = {"name": name, "quantity": int(quantity), "warehouse": warehouse}
    return stock


def reserve(stock, sku, quantity, warehouse):
    item = stock.get(sku)
    if item is None:
        raise KeyError(f"unknown sku {sku}")
    if item["warehouse"] != warehouse:
        raise ValueError(f"{sku} is not stored in {warehouse}")
    if item["quantity"] < quantity:
        return False
    item["quantity"] -= quantity
    log.info("reserved %d of %s in %s", quantity, sku, warehouse)
    return True


def restock(stock, sku, quantity, warehouse):
    item = stock.setdefault(sku, {"name": sku, "quantity": 0, "warehouse": warehouse})
    item["quantity"] += quantity
    log.info("restocked %d of %s in %s", quantity, sku, warehouse)
    return item["quantity"]


def process_orders(stock, orders, warehouse):
    shipped = []
    backordered = []
    for order in orders:
        if reserve(stock, order["sku"], order["quantity"], warehouse):
            shipped.append(order["id"])
        else:
            backordered.append(order["id"])
            restock(stock, order["sku"], order["quantity"] * 2, warehouse)
    return shipped, backordered
'''

SCHEDULER = '''class TaskQueue:
    def __init__(self, workers, retries):
        self.workers = workers
        self.retries = retries
        self.pending = []
        self.running = {}
        self.failed = []
        self.done = []

    def submit(self, task, priority):
        self.pending.append((priority, task))
        self.pending.sort(key=lambda entry: entry[0])

    def start_next(self):
        if len(self.running) >= self.workers or not self.pending:
            return None
        priority, task = self.pending.pop(0)
        self.running[task.name] = (priority, task, 0)
        return task

    def finish(self, name, ok):
        priority, task, attempts = self.running.pop(name)
        if ok:
            self.done.append(task)
            return
        if attempts + 1 < self.retries:
            self.running[name] = (priority, task, attempts + 1)
            return
        self.failed.append(task)

    def cancel(self, name):
        for index, (priority, task) in enumerate(self.pending):
            if task.name == name:
                del self.pending[index]
                return True
        if name in self.running:
            del self.running[name]
            return True
        return False

    def status(self):
        return {
            "pending": len(self.pending),
            "running": len(self.running),
            "failed": len(self.failed),
            "done": len(self.done),
        }
'''

REPORTING = '''def render_report(title, rows, columns, width):
    lines = []
    lines.append("=" * width)
    lines.append("%s" % title.center(width))
    lines.append("=" * width)
    header = ""
    for column in columns:
        header = header + "%-12s" % column
    lines.append(header)
    lines.append("-" * width)
    totals = {}
    for row in rows:
        line = ""
        for column in columns:
            value = row.get(column, "")
            if isinstance(value, float):
                line = line + "%-12.2f" % value
                totals[column] = totals.get(column, 0.0) + value
            elif isinstance(value, int):
                line = line + "%-12d" % value
                totals[column] = totals.get(column, 0) + value
            else:
                line = line + "%-12s" % value
        lines.append(line)
    lines.append("-" * width)
    footer = ""
    for column in columns:
        if column in totals:
            footer = footer + "%-12s" % ("%.2f" % totals[column])
        else:
            footer = footer + "%-12s" % ""
    lines.append(footer)
    lines.append("rows: %d, columns: %d" % (len(rows), len(columns)))
    return "\\n".join(lines)
'''


@dataclass(frozen=True)
class Edit:
    kind: str  # rename, signature, insert, reformat
    source: str
    instruction: str


EDITS = [  # instructions Qwen2.5-Coder-0.5B carries out (it returns others unchanged)
    Edit("rename", ORDERS, "Rename the variable `customer` to `client` everywhere in it."),
    Edit("signature", ORDERS, "Rename the parameter `include_refunds` to `net_of_refunds` and "
         "add a parameter `precision=2` used by every `round` call."),
    Edit("insert", SCHEDULER, "Add a one-line docstring to every method and make `submit` "
         "raise ValueError when `priority` is negative."),
    Edit("reformat", REPORTING, "Use single quotes instead of double quotes for every string "
         "literal; change nothing else."),
    Edit("rename", INVENTORY, "Rename `stock` to `inventory` and `sku` to `item_code` "
         "everywhere."),
    Edit("signature", INVENTORY, "Rename the function `reserve` to `try_reserve` and `restock` "
         "to `replenish`, and update every call."),
    Edit("insert", SCHEDULER, "Add `self.cancelled = []` to `__init__`, append the task to it "
         "in `cancel`, and add its length to `status`."),
    Edit("rename", SCHEDULER, "Rename the attribute `pending` to `queued` and `running` to "
         "`active` everywhere."),
]
KINDS = ["rename", "signature", "insert", "reformat"]


def messages(edit: Edit) -> list[dict[str, str]]:
    return [{"role": "user", "content": (
        f"Here is some Python code:\n\n```python\n{edit.source}```\n\n{edit.instruction} "
        "Reply with the complete updated code in one code block and nothing else.")}]


def first_of_each_kind() -> list[Edit]:
    return [next(e for e in EDITS if e.kind == kind) for kind in KINDS]
