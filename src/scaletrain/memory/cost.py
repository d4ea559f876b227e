"""What a job costs per device count, and the cheapest count that meets a deadline (`plan --price`, `--deadline`).

The job is the config's own: its optimizer steps at ``scaling.num_workers`` with its per-device batch, so its
samples are fixed; at n devices (the per-device batch kept, as ``scale`` does) it takes steps x workers / n steps of
the plan's predicted step time at n. Device-hours are hours x n, the cost device-hours x the price per device-hour.
"""

from __future__ import annotations

from scaletrain.errors import ConfigError


def parse_prices(specs: list[str], device_named) -> dict[str, float]:
    """``--price mi300x=3.2 --price h100=4.5`` -> {device key: price per device-hour}; one line when malformed."""
    prices = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        try:
            price = float(value)
        except ValueError:
            raise ConfigError(f"--price {spec}: give DEVICE=PRICE_PER_DEVICE_HOUR, e.g. --price mi300x=3.2") from None
        if not price > 0:
            raise ConfigError(f"--price {spec}: the price per device-hour must be > 0")
        try:
            device = device_named(name)
        except ConfigError as e:  # an unknown device: the plan does not compare it (its close names said)
            raise ConfigError(f"--price {spec}: {str(e).split(': ', 1)[1]}") from None
        if device.key == "cpu":
            raise ConfigError(f"--price {spec}: price the accelerators the plan compares (mi300x, h100, ...), not cpu")
        prices[device.key] = price
    return prices


def job_rows(step_times: dict[int, float], steps: int, workers: int, price: float, fits: dict[int, bool]
             ) -> list[dict]:
    """One row per device count: hours, device-hours and cost of the job's samples."""
    rows = []
    for n, step_s in sorted(step_times.items()):
        hours = steps * workers / n * step_s / 3600
        rows.append({"devices": n, "fits": fits.get(n, False), "step_s": step_s, "hours": hours,
                     "device_hours": hours * n, "cost": hours * n * price})
    return rows


def cheapest(by_device: dict[str, list[dict]], deadline_hours: float | None) -> tuple[str, dict] | None:
    """The cheapest (device, row) that fits and finishes within ``deadline_hours`` (any time when None)."""
    options = [(d, r) for d, rows in by_device.items() for r in rows
               if r["fits"] and (deadline_hours is None or r["hours"] <= deadline_hours)]
    return min(options, key=lambda o: (o[1]["cost"], o[1]["hours"])) if options else None
