"""The schema-only codec between a typed table and the model's encoded space.

Every map here is fixed by the public schema (bounds, transforms, category lists) and is
applied row by row, so it uses no statistic of the data and spends no privacy (docs/architecture.md,
privacy rule 2: only the schema and the configuration are public). The encoded space, per column
in schema order:

- numeric: one continuous feature u = (t(x) - t(lo)) / (t(hi) - t(lo)) in [0, 1],
  t = identity or log1p; if nullable, null -> u = 0 plus a categorical `<col>__missing`
  feature (cardinality 2, 1 = missing) right after it;
- integer: the same on the dequantized value x + v over the cells [lo, hi + 1), v ~ U[0, 1)
  when `encode` gets a generator (the cell centre, v = 1/2, without one). Integers are
  discrete: without dequantization a flow can pile unbounded density on one value (a
  capital-gain of 0) and its likelihood stops being a density (Theis et al. 2016);
  `decode` floors, so decode(encode(x)) == x;
- categorical with K labels: one categorical feature holding the code 0..K-1 (declared order)
  as a float; if nullable, null -> code K (cardinality K + 1).

`decode` maps ANY finite array back to rows that are valid under the schema.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import polars as pl

from privflow.core.errors import DataError
from privflow.data.schema import Column, Schema


@dataclass(frozen=True)
class Feature:
    """One coordinate of the encoded space; `cardinality` is None for continuous features."""

    name: str
    column: str
    kind: Literal["continuous", "categorical"]
    cardinality: int | None


def _t(x: np.ndarray | float, transform: str) -> Any:
    return np.log1p(x) if transform == "log1p" else x


def _t_inv(v: np.ndarray, transform: str) -> np.ndarray:
    return np.expm1(v) if transform == "log1p" else v


class Codec:
    """Encode a validated, typed frame to float32 features and decode any array back to rows."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        feats: list[Feature] = []
        for col in schema.columns:
            if col.is_categorical:
                k = len(col.categories or ())
                feats.append(Feature(col.name, col.name, "categorical", k + 1 if col.nullable else k))
            else:
                feats.append(Feature(col.name, col.name, "continuous", None))
                if col.nullable:
                    feats.append(Feature(f"{col.name}__missing", col.name, "categorical", 2))
        self.features: list[Feature] = feats

    @classmethod
    def from_schema(cls, schema: Schema) -> Codec:
        return cls(schema)

    @property
    def dim(self) -> int:
        return len(self.features)

    @property
    def cardinalities(self) -> list[int | None]:
        """The model's input spec: None for a continuous feature, else the number of codes."""
        return [f.cardinality for f in self.features]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.schema.dataset.name,
            "dim": self.dim,
            "features": [asdict(f) for f in self.features],
            "columns": [c.model_dump(mode="json") for c in self.schema.columns],
        }

    # ------------------------------------------------------------------ encode

    @staticmethod
    def _domain(col: Column) -> tuple[float, float]:
        """The encoded interval in the column's own units: integer cells span [lo, hi + 1)."""
        lo, hi = col.bounds  # type: ignore[misc]
        if col.type == "integer":
            return float(math.ceil(lo)), float(math.floor(hi) + 1)
        return float(lo), float(hi)

    @classmethod
    def _scale(cls, col: Column) -> tuple[float, float]:
        lo, hi = cls._domain(col)
        t_lo, t_hi = float(_t(lo, col.transform)), float(_t(hi, col.transform))
        return t_lo, t_hi - t_lo

    def encode(self, df: pl.DataFrame, rng: np.random.Generator | None = None) -> np.ndarray:
        """Typed frame (from `validate`) -> float32 array [n, dim]; see the module docstring.

        `rng` draws the integer columns' dequantization offsets (uniform, data-independent).
        """
        missing = [c for c in self.schema.names if c not in df.columns]
        if missing:
            raise DataError(f"Cannot encode: the table lacks the declared column(s) {missing}.")
        n = df.height
        out = np.empty((n, self.dim), dtype=np.float32)
        j = 0
        for col in self.schema.columns:
            s = df.get_column(col.name)
            isnull = s.is_null().to_numpy()
            if isnull.any() and not col.nullable:
                raise DataError(
                    f"Cannot encode column '{col.name}': {int(isnull.sum())} null value(s) in a column that is "
                    "not nullable; validate the table first."
                )
            if col.is_categorical:
                cats = list(col.categories or ())
                codes = s.cast(pl.String).replace_strict(
                    cats, list(range(len(cats))), default=None, return_dtype=pl.Int64
                )
                unknown = codes.is_null().to_numpy() & ~isnull
                if unknown.any():
                    raise DataError(
                        f"Cannot encode column '{col.name}': {int(unknown.sum())} value(s) are not in its "
                        "declared categories; validate the table first."
                    )
                out[:, j] = codes.fill_null(len(cats)).to_numpy().astype(np.float32)
                j += 1
                continue
            try:
                x = s.cast(pl.Float64).to_numpy().astype(np.float64)
            except Exception:
                raise DataError(
                    f"Cannot encode column '{col.name}': its {s.dtype} values are not numbers; encode the typed "
                    "frame returned by validate()."
                ) from None
            t_lo, width = self._scale(col)
            lo, hi = col.bounds  # type: ignore[misc]
            xv = np.clip(np.where(isnull, lo, x), lo, hi)
            if col.type == "integer":
                offset = rng.random(n) if rng is not None else 0.5
                xv = np.floor(xv) + offset
            u = np.clip((_t(xv, col.transform) - t_lo) / width, 0.0, 1.0)
            out[:, j] = np.where(isnull, 0.0, u)
            j += 1
            if col.nullable:
                out[:, j] = isnull.astype(np.float32)
                j += 1
        return out

    # ------------------------------------------------------------------ decode

    def decode(self, array: np.ndarray) -> pl.DataFrame:
        """Any finite array [n, dim] -> rows valid under the schema (typed as `validate` returns).

        Continuous: clip to [0, 1], invert the scaling and transform, floor integer columns
        (undoing dequantization), clip to the bounds. Categorical: floor, clip to 0..cardinality-1, look up the label
        (the missing code gives null).
        """
        a = np.asarray(array, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != self.dim:
            raise ValueError(f"decode expects an array of shape [n, {self.dim}], got {list(a.shape)}")
        if np.isnan(a).any():
            raise ValueError("decode got NaN values; the sampler must return finite numbers")
        n = a.shape[0]
        cols: dict[str, pl.Series] = {}
        j = 0
        for col in self.schema.columns:
            if col.is_categorical:
                cats = list(col.categories or ())
                k = len(cats)
                card = k + 1 if col.nullable else k
                codes = np.clip(np.floor(a[:, j]), 0, card - 1).astype(np.int64)
                # one take on the label array (the missing code K points at its null entry)
                labels = pl.Series(col.name, cats + [None], dtype=pl.String).cast(pl.Enum(cats))
                cols[col.name] = labels.gather(codes)
                j += 1
                continue
            lo, hi = col.bounds  # type: ignore[misc]
            t_lo, width = self._scale(col)
            u = np.clip(a[:, j], 0.0, 1.0)
            x = _t_inv(t_lo + u * width, col.transform)
            j += 1
            if col.nullable:
                isnull = np.clip(np.floor(a[:, j]), 0, 1) == 1
                j += 1
            else:
                isnull = np.zeros(n, dtype=bool)
            if col.type == "integer":
                xi = np.clip(np.floor(x), math.ceil(lo), math.floor(hi)).astype(np.int64)
                s = pl.Series(col.name, xi, dtype=pl.Int64)
            else:
                s = pl.Series(col.name, np.clip(x, lo, hi), dtype=pl.Float64)
            if isnull.any():
                s = pl.select(pl.when(pl.Series(isnull)).then(None).otherwise(s)).to_series().alias(col.name)
            # integer columns stay Int64 (nullable in polars), never floats like 39.0
            cols[col.name] = s.cast(pl.Int64 if col.type == "integer" else pl.Float64)
        return pl.DataFrame(cols)


def to_pandas(frame: pl.DataFrame, schema: Schema) -> Any:
    """A decoded (or validated) frame as pandas, keeping integer columns integer: nullable
    integer columns become pandas `Int64`, not float64."""
    out = frame.to_pandas()
    for col in schema.columns:
        if col.type == "integer" and col.name in out.columns:
            out[col.name] = out[col.name].astype("Int64")
    return out


def restore_types(frame: pl.DataFrame, schema: Schema) -> pl.DataFrame:
    """Schema types back on a table that went through pandas (a pyfunc's output): integer
    columns to Int64 (a float64 column of whole numbers with NaN for nulls becomes a nullable
    integer column again), numeric to Float64, categoricals to strings. Other columns untouched."""
    exprs = []
    for col in schema.columns:
        if col.name not in frame.columns:
            continue
        dtype = frame.schema[col.name]
        if col.type == "integer":
            c = pl.col(col.name)
            if dtype.is_float():
                c = pl.when(c.is_nan()).then(None).otherwise(c)
            exprs.append(
                c.round(0).cast(pl.Int64, strict=False).alias(col.name)
                if dtype.is_float()
                else c.cast(pl.Int64, strict=False).alias(col.name)
            )
        elif col.type == "numeric":
            exprs.append(pl.col(col.name).cast(pl.Float64, strict=False).fill_nan(None).alias(col.name))
        else:
            exprs.append(pl.col(col.name).cast(pl.String).alias(col.name))
    return frame.with_columns(exprs) if exprs else frame
