"""Write `clinic_visits.csv`: a made-up table of clinic visits for trying privflow on a table
of your own (the README's "your own table" path: `privflow schema draft`, `check`, `run`).

Nothing in it is real: every value is drawn from the fixed seed below. It has what real
tables carry and Adult does not: an identifier to leave out, a date, a datetime, a yes/no
flag, a measurement recorded to one decimal, and a point mass (most patients drink no alcohol,
so `alcohol_units` is exactly 0 in most rows).

    python examples/clinic_visits.py [OUT.csv] [--rows N]
"""

from __future__ import annotations

import argparse
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

DEPARTMENTS = ("cardiology", "general", "orthopaedics", "paediatrics", "respiratory")


def visits(rows: int, seed: int = 20261128) -> pl.DataFrame:
    """`rows` made-up visits; the columns depend on each other (age, smoking, department, stay)."""
    rng = np.random.default_rng(seed)
    age = np.clip(rng.normal(52, 18, rows), 0, 99).astype(int)
    smoker = rng.random(rows) < np.where(age < 18, 0.01, 0.22)
    dept = np.where(age < 16, "paediatrics", rng.choice(DEPARTMENTS[:3] + DEPARTMENTS[4:], rows))
    dept = np.where(smoker & (rng.random(rows) < 0.4), "respiratory", dept)
    weight = np.round(np.clip(np.where(age < 16, 12 + 3.2 * age, rng.normal(78, 14, rows)), 3, 200), 1)
    drinks = rng.random(rows) < 0.35
    alcohol = np.where(drinks, np.round(rng.gamma(2.0, 4.0, rows), 1), 0.0)
    day0 = date(2021, 1, 1)
    visit_day = [day0 + timedelta(days=int(d)) for d in rng.integers(0, 3 * 365, rows)]
    arrived = [
        datetime(d.year, d.month, d.day, int(h), int(m))
        for d, h, m in zip(visit_day, np.clip(rng.normal(11, 3, rows), 0, 23), rng.integers(0, 60, rows), strict=True)
    ]
    stay = np.clip(rng.poisson(1 + age / 25 + 2 * smoker), 0, 60)
    readmitted = rng.random(rows) < 1 / (1 + np.exp(-(-3.0 + 0.03 * age + 0.8 * smoker + 0.1 * stay)))
    return pl.DataFrame(
        {
            "visit_id": [f"V{100000 + i}" for i in rng.permutation(rows)],
            "visit_date": [d.strftime("%Y-%m-%d") for d in visit_day],
            "arrived_at": [t.strftime("%Y-%m-%d %H:%M") for t in arrived],
            "age": age,
            "smoker": np.where(smoker, "yes", "no"),
            "department": dept,
            "weight_kg": weight,
            "alcohol_units": alcohol,
            "stay_days": stay,
            "readmitted": np.where(readmitted, "yes", "no"),
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="clinic_visits.csv", type=Path)
    ap.add_argument("--rows", type=int, default=5000)
    args = ap.parse_args()
    visits(args.rows).write_csv(args.out)
    print(f"wrote {args.rows} made-up rows to {args.out}")


if __name__ == "__main__":
    main()
