"""The dataset schema: the public description of a table (privacy rule 2).

Everything the pipeline may know about the data without spending privacy lives here:
column names, types, numeric bounds, category lists, which columns may be missing, the
dataset's identity and its total budget. Nothing in it is read off the private rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from privflow.core.config import Promotion
from privflow.core.errors import SchemaError
from privflow.core.yaml_file import read_mapping

ColumnType = Literal["numeric", "integer", "categorical"]
Transform = Literal["none", "log1p"]


MAX_ATOMS = 64  # declared point masses per column
SCORE_COLUMNS = ("loglik", "anomaly")  # the columns `privflow score` writes beside a table's own


def yaml_strings(v: object, field: str) -> object:
    """A YAML list of values as they are written in the data: numbers become their text, and
    booleans or nulls are refused (YAML reads unquoted yes/no/on/off/true/false as booleans and
    null or ~ as no value, which would never match the data's text)."""
    if not isinstance(v, list | tuple):
        return v
    nested = [x for x in v if not isinstance(x, str | int | float | bool) and x is not None]
    if nested:
        raise ValueError(f"{field} must be a flat list of values as written in the data, got {nested[0]!r} in it")
    odd = [x for x in v if isinstance(x, bool) or x is None]
    if odd:
        raise ValueError(
            f"{field} {list(v)} hold {', '.join(repr(x) for x in odd)}, not text: YAML reads unquoted yes, no, on, "
            "off, true, false as booleans and null or ~ as no value; quote each one as it appears in the data, "
            "e.g. ['yes', 'no']"
        )
    return tuple(str(x) for x in v)


def _refuse_spaced(values: Sequence[str], what: str) -> None:
    """Text the data is matched against, which would never match: the data's text values are read
    with the spaces around them removed (privflow/data/validation.py)."""
    spaced = [t for t in values if t != t.strip()]
    if spaced:
        raise ValueError(
            f"{what} {spaced} have spaces around them; values are read with the spaces around them removed, "
            "so declare them without"
        )


class Budget(BaseModel):
    """A dataset's total (epsilon, delta) across all runs, composed by the ledger."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)


class Column(BaseModel):
    """One column: numeric/integer with public bounds, or categorical with a public list."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str = Field(min_length=1)
    type: ColumnType
    bounds: tuple[float, float] | None = None
    categories: tuple[str, ...] | None = None
    transform: Transform = "none"
    nullable: bool = False
    atoms: tuple[float, ...] = Field(
        (),
        max_length=MAX_ATOMS,
        description="public point masses of a numeric or integer column (e.g. 0 for an amount that is often "
        "exactly zero): each gets a cell of its own in the DP marginals, so it is kept exactly",
    )

    @model_validator(mode="after")
    def _check(self) -> Column:
        if self.type in ("numeric", "integer"):
            if self.bounds is None:
                raise ValueError(f"column '{self.name}' is {self.type} and needs public bounds [low, high]")
            low, high = self.bounds
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                one = " (a column that holds one value tells nothing: drop it from the schema and the data, or "
                raise ValueError(
                    f"column '{self.name}': bounds must be finite with low < high, got {list(self.bounds)}"
                    + (one + "declare it categorical with that value as its one category)" if low == high else "")
                )
            if self.type == "integer" and math.ceil(low) > math.floor(high):
                raise ValueError(
                    f"column '{self.name}' is integer but its bounds {list(self.bounds)} hold no whole number"
                )
            if not math.isfinite(high - low):  # e.g. [-1e308, 1e308]: every scaled value is 0 or NaN
                raise ValueError(
                    f"column '{self.name}': bounds {list(self.bounds)} span more than a float can hold; "
                    "declare the range the values really take"
                )
            if self.categories is not None:
                raise ValueError(f"column '{self.name}' is {self.type}; 'categories' is only for categorical columns")
            if self.transform == "log1p" and low < 0:
                raise ValueError(f"column '{self.name}': a log1p transform needs bounds >= 0")
            outside = [a for a in self.atoms if not low <= a <= high]
            if outside:
                raise ValueError(f"column '{self.name}': atoms {outside} lie outside its bounds {list(self.bounds)}")
            if self.type == "integer" and any(a != math.floor(a) for a in self.atoms):
                raise ValueError(f"column '{self.name}' is integer; its atoms must be whole numbers")
            if len(set(self.atoms)) != len(self.atoms):
                raise ValueError(f"column '{self.name}': atoms are not unique")
        else:
            if not self.categories:
                raise ValueError(f"column '{self.name}' is categorical and needs a non-empty 'categories' list")
            if len(set(self.categories)) != len(self.categories):
                raise ValueError(f"column '{self.name}': categories are not unique")
            _refuse_spaced([c for c in self.categories if c.strip()], f"column '{self.name}': categories")
            if any(not c.strip() for c in self.categories):
                raise ValueError(
                    f"column '{self.name}': the empty text '' cannot be a category, since an empty field is "
                    "read as missing; declare the column `nullable: true` for empty fields, or give the "
                    "category a visible label in the data and the schema"
                )
            if self.bounds is not None or self.transform != "none" or self.atoms:
                raise ValueError(f"column '{self.name}' is categorical; 'bounds', 'transform' and 'atoms' do not apply")
        return self

    @field_validator("categories", mode="before")
    @classmethod
    def _as_strings(cls, v: object) -> object:
        return yaml_strings(v, "categories")

    @field_validator("atoms", mode="before")
    @classmethod
    def _numbers(cls, v: object) -> object:
        """Atoms are numbers as YAML writes them: a boolean (unquoted yes/true) or text is refused,
        not turned into 1.0 or parsed."""
        if isinstance(v, list | tuple):
            odd = [x for x in v if isinstance(x, bool) or not isinstance(x, int | float)]
            if odd:
                raise ValueError(f"atoms must be numbers, got {', '.join(repr(x) for x in odd)}")
        return v

    @property
    def is_categorical(self) -> bool:
        return self.type == "categorical"


class DatasetInfo(BaseModel):
    """The dataset's identity (the ledger's key) and its total privacy budget."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    budget: Budget = Budget(epsilon=10.0, delta=1e-5)
    expected_rows: int | None = Field(
        None,
        ge=1,
        description="public, approximate row count; turns batch size and epochs into a Poisson "
        "sample rate and a step count without reading the data",
    )
    missing_values: tuple[str, ...] = Field(
        (),
        description="text that means a missing value besides an empty field (e.g. '?' or 'NA'), in any "
        "text column (every CSV column); where a column is not nullable such a value fails its check",
    )
    promotion: Promotion = Field(
        "if_better",
        description="the runs' default for when the registry alias moves to a new version (the run "
        "config's `promotion`, `--promote`): if_better (default) spends a small epsilon on a DP "
        "comparison once a version holds the alias; `never` turns that charge off for this dataset. "
        "A run's --promote or its config's `promotion` takes precedence",
    )

    @field_validator("missing_values", mode="before")
    @classmethod
    def _as_strings(cls, v: object) -> object:
        return yaml_strings(v, "missing_values")

    @field_validator("missing_values")
    @classmethod
    def _unspaced(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        _refuse_spaced(v, "missing_values")
        return v


class Schema(BaseModel):
    """A table's public schema; `target` names the label used by utility diagnostics."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    dataset: DatasetInfo
    columns: tuple[Column, ...] = Field(min_length=1)
    target: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Schema:
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate column names: {dup}")
        for col in self.columns:
            clash = sorted(set(col.categories or ()) & set(self.dataset.missing_values))
            if clash:
                raise ValueError(
                    f"{clash} of column '{col.name}' is both a declared category and a dataset.missing_values "
                    "token; a value cannot be both, so drop it from one of the two"
                )
        folded: dict[str, list[str]] = {}
        for n in names:
            folded.setdefault(n.casefold(), []).append(n)
        same = [group for group in folded.values() if len(group) > 1]
        if same:
            raise ValueError(
                f"column names {same[0]} differ only in letter case; the validation library matches "
                "column names without regard to case, so rename one of them in the schema and the data"
            )
        internal = [n for n in names if n.lstrip("_").casefold().startswith("privflow") and n.startswith("_")]
        if internal:
            raise ValueError(
                f"column name(s) {internal} are reserved: names that start with '_privflow' are privflow's own "
                "(e.g. the quarantine file's row number and failed checks), so rename them in the schema and the data"
            )
        reserved = [n for n in names if n.casefold() in SCORE_COLUMNS]  # case-blind, as the validator matches
        if reserved:
            raise ValueError(
                f"column name(s) {reserved} are reserved: `privflow score` appends columns of those names to a "
                "table's own, so rename them in the schema and the data"
            )
        if self.target is not None:
            if self.target not in names:
                raise ValueError(f"target '{self.target}' is not a declared column")
            if not self.column(self.target).is_categorical:
                raise ValueError(f"target '{self.target}' must be categorical")
            target = self.column(self.target)
            if len(target.categories or ()) + (1 if target.nullable else 0) < 2:
                raise ValueError(
                    f"target '{self.target}' has a single class; a target needs at least two (two categories, "
                    "or one and `nullable: true`), so declare the other classes or drop `target`"
                )
        return self

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def without(self, name: str) -> Schema:
        """The same dataset minus one column (and without a target if it was that column): the
        columns a flow models when the target head takes the target (privflow/data/target_head.py)."""
        self.column(name)
        return Schema(
            dataset=self.dataset,
            columns=tuple(c for c in self.columns if c.name != name),
            target=None if self.target == name else self.target,
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> Schema:
        """Read a schema file; any problem becomes a SchemaError naming the file and the field."""
        p = Path(path)
        if p.is_dir():
            raise SchemaError(f"Schema path '{p}' is a folder; pass the schema's YAML file.")
        if not p.is_file():
            raise SchemaError(f"Schema file '{p}' does not exist.")
        raw = read_mapping(p, "Schema file", SchemaError)
        if not raw:
            raise SchemaError(f"Schema file '{p}' must hold a mapping with 'dataset' and 'columns'.")
        return cls.validated(raw, f"Schema file '{p}'")

    @classmethod
    def validated(cls, raw: dict[str, Any], source: str = "The schema") -> Schema:
        """`raw` as a Schema; any problem becomes one SchemaError naming `source` and each field."""
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            errors = exc.errors()
            # a list whose items failed is also "too short" once they are dropped: say only why they failed
            failed = {e["loc"][:1] for e in errors if len(e["loc"]) > 1}
            errors = [e for e in errors if not (e["type"] == "too_short" and tuple(e["loc"]) in failed)] or errors
            problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'schema'}: {e['msg']}" for e in errors)
            raise SchemaError(f"{source} is invalid: {problems}.") from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
