"""The CLI's cron check and the default monitoring schedule, against Prefect's own cron
parser (the one its scheduler uses)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows import inputs

FIELD_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def prefect_accepts(cron: str) -> bool:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        return False
    return True


def fires(cron: str, start: datetime, count: int) -> list[datetime]:
    from prefect._vendor.croniter import croniter

    it = croniter(cron, start)
    return [it.get_next(datetime) for _ in range(count)]


@st.composite
def cron_field(draw, low: int, high: int):
    """One field from the grammar: *, n, a-b, any of those /step, comma lists; values a
    little out of range on purpose so invalid ones are drawn too."""
    def item():
        kind = draw(st.sampled_from(["*", "n", "range"]))
        if kind == "*":
            base = "*"
        elif kind == "n":
            base = str(draw(st.integers(low, high + 2)))
        else:
            a = draw(st.integers(low, high))
            base = f"{a}-{draw(st.integers(a, high + 1))}"
        if draw(st.booleans()):
            base += f"/{draw(st.integers(1, 15))}"
        return base
    return ",".join(item() for _ in range(draw(st.integers(1, 3))))


@st.composite
def crons(draw):
    return " ".join(draw(cron_field(low, high)) for low, high in FIELD_RANGES)


@settings(max_examples=200, deadline=None)
@given(crons())
def test_what_the_cli_accepts_prefect_accepts_and_monitoring_never_coincides(cron):
    try:
        checked = inputs.check_cron(cron)
    except inputs.InputError as exc:
        assert str(exc).startswith(f"--cron {cron!r}: ")
        assert "\n" not in str(exc)
        return
    assert prefect_accepts(checked), cron
    monitor = inputs.monitor_cron_for(checked)
    assert prefect_accepts(monitor), monitor
    start = datetime(2026, 1, 1)
    recalibrations = set(fires(checked, start, 40))
    monitorings = fires(monitor, start, 40)
    assert recalibrations.isdisjoint(monitorings), (checked, monitor)
    # monitoring follows its recalibration, never more than an hour later
    first = min(recalibrations)
    assert timedelta(0) < min(m for m in monitorings if m > first) - first <= timedelta(hours=1)


@pytest.mark.parametrize(("cron", "monitor"), [
    ("0 3 * * *", "30 3 * * *"),
    ("29 */2 * * *", "59 */2 * * *"),
    ("45 3 * * *", "45 3 * * * 30"),
    ("* * * * *", "* * * * * 30"),
    ("*/5 1-3 * jan-mar mon-fri", "*/5 1-3 * jan-mar mon-fri 30"),
    ("@daily", "30 0 * * *"),
])
def test_default_monitoring_schedule(cron, monitor):
    assert inputs.monitor_cron_for(cron) == monitor


@pytest.mark.parametrize(("cron", "message"), [
    ("61 * * * *", "minute '61' is not in 0-59"),
    ("* 24 * * *", "hour '24' is not in 0-23"),
    ("* * 0 * *", "day of month '0' is not in 1-31"),
    ("* * * 13 *", "month '13' is not in 1-12"),
    ("* * * * 8", "day of week '8' is not in 0-7"),
    ("*/0 * * * *", "minute step '0' is not a positive integer"),
    ("5-1 * * * *", "minute range '5-1' runs backwards"),
    ("* * * * 4/3", "day of week step '4/3' needs * or a range before it"),
    ("* * * * 7-7", "day of week range '7-7' starts at 7"),
    ("* * * *", "has 4 fields"),
    ("", "has 0 fields"),
    ("@often", "has 1 fields"),
])
def test_bad_cron_is_one_line_naming_the_field(cron, message):
    with pytest.raises(inputs.InputError) as caught:
        inputs.check_cron(cron)
    assert str(caught.value).startswith(f"--cron {cron!r}: {message}")
