"""The dataset schema: the public description of a table (privacy rule 2).

Everything the pipeline may know about the data without spending privacy lives here:
column names, types, numeric bounds, category lists, which columns may be missing, the
dataset's identity and its total budget. Nothing in it is read off the private rows.

Columns come in the types a table is written in (its surface): numeric, integer and
categorical, which the model takes as they are, and date, datetime, boolean and ignore (alias
`id`), which privflow/data/lowering.py lowers to the first three before anything is modelled.

`rules` are public rules between columns (inequality, combinations, conditional,
missing_together) that every released row meets; their types are here, their check against
the columns and their evaluation in privflow/data/rules.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from privflow.core.config import Promotion
from privflow.core.errors import SchemaError
from privflow.core.yaml_file import read_mapping

ColumnType = Literal["numeric", "integer", "categorical", "date", "datetime", "boolean", "ignore"]
Transform = Literal["none", "log1p"]
Granularity = Literal["second", "minute", "hour", "day"]
OutOfBounds = Literal["clamp", "fail"]
BOUNDED_TYPES = ("numeric", "integer", "date", "datetime")  # the types whose values are checked against bounds

COLUMN_TYPES: tuple[str, ...] = ColumnType.__args__  # type: ignore[attr-defined]
TYPE_ALIASES = {"id": "ignore"}  # a spelling the schema accepts for a type, and the type it means
MODELLED_TYPES = ("numeric", "integer", "categorical")  # what the codec takes; the rest is lowered to these
TEMPORAL_TYPES = ("date", "datetime")
DEFAULT_FORMATS = {"date": "%Y-%m-%d", "datetime": "%Y-%m-%dT%H:%M:%S"}
DEFAULT_LABELS = ("true", "false")  # a boolean column's [true text, false text] unless declared
GRANULARITY_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
MAX_DECIMALS = 15
EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)
# which types each type-specific field applies to (the older fields keep their own checks)
_APPLIES = {"labels": ("boolean",), "format": TEMPORAL_TYPES, "granularity": ("datetime",), "decimals": ("numeric",)}


MAX_ATOMS = 64  # declared point masses per column
SCORE_COLUMNS = ("loglik", "anomaly")  # the columns `privflow score` writes beside a table's own
# what `privflow schema draft` writes where the data owner must fill a value in (Column refuses it)
DRAFT_PLACEHOLDER = "<FILL>"


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
    with the spaces around them removed (privflow/data/validation/coerce.py)."""
    spaced = [t for t in values if t != t.strip()]
    if spaced:
        raise ValueError(
            f"{what} {spaced} have spaces around them; values are read with the spaces around them removed, "
            "so declare them without"
        )


def time_number(value: date | datetime, kind: str) -> int:
    """A date column's value as whole days, a datetime column's as whole seconds, since 1970-01-01
    (naive time; the number a temporal column's bounds and atoms are held as)."""
    if kind == "date":
        day = value.date() if isinstance(value, datetime) else value
        return (day - EPOCH.date()).days
    moment = value if isinstance(value, datetime) else datetime(value.year, value.month, value.day)
    return (moment - EPOCH) // _SECOND


def time_value(number: int, kind: str) -> date | datetime:
    """The inverse of `time_number`."""
    if kind == "date":
        return EPOCH.date() + timedelta(days=number)
    return EPOCH + timedelta(seconds=number)


def _iso_time(x: object, kind: str, name: str) -> int:
    """One public bound or atom of a temporal column (ISO text, or the date / datetime YAML reads
    an unquoted one as) as `time_number`."""
    example = "'2015-01-01'" if kind == "date" else "'2020-01-01T00:00:00'"
    value: date | datetime | None = None
    if isinstance(x, datetime):
        value = x
    elif isinstance(x, date):
        value = x
    elif isinstance(x, str):
        try:
            value = datetime.fromisoformat(x.strip()) if kind == "datetime" else date.fromisoformat(x.strip())
        except ValueError:
            value = None
    if value is None:
        raise ValueError(
            f"column '{name}' is {kind}; its bounds and atoms are {kind}s written as ISO text (e.g. {example}), "
            f"got {x!r}"
        )
    if isinstance(value, datetime) and value.tzinfo is not None:
        raise ValueError(f"column '{name}': {x!r} has a time zone; write {kind}s without one (local or UTC time)")
    if kind == "date" and isinstance(value, datetime) and value != datetime(value.year, value.month, value.day):
        raise ValueError(f"column '{name}' is date; {x!r} has a time of day, write the date alone (e.g. {example})")
    return time_number(value, kind)


class Budget(BaseModel):
    """A dataset's total (epsilon, delta) across all runs, composed by the ledger."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)


class Column(BaseModel):
    """One column: numeric/integer with public bounds, categorical with a public list, or one of
    the types lowered to those (privflow/data/lowering.py): date and datetime with public bounds
    and a text format, boolean with its two labels, ignore (alias `id`), which is not modelled.

    A date column's bounds and atoms are held as whole days since 1970-01-01, a datetime column's
    as whole seconds, and written back as ISO text (`model_dump`, `to_yaml`)."""

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
        description="public point masses of a numeric, integer, date or datetime column (e.g. 0 for an amount "
        "that is often exactly zero): each gets a cell of its own in the DP marginals, so it is kept exactly",
    )
    labels: tuple[str, ...] | None = Field(
        None,
        description="a boolean column's [true text, false text] as written in the data (default ['true', 'false'])",
    )
    format: str | None = Field(
        None,
        description="a date or datetime column's strftime/strptime format of its text (default '%Y-%m-%d' and "
        "'%Y-%m-%dT%H:%M:%S')",
    )
    granularity: Granularity | None = Field(
        None, description="a datetime column's unit (default second): the values are modelled as whole units"
    )
    decimals: int | None = Field(
        None, description="a numeric column's synthetic values are written rounded to this many decimals (0..15)"
    )
    on_out_of_bounds: OutOfBounds | None = Field(
        None,
        description="a numeric, integer, date or datetime column's value past its bounds: `clamp` (to the nearest "
        "bound; the row is kept) or `fail` (the row fails). Default: the dataset's `on_out_of_bounds`",
    )
    other: str | None = Field(
        None,
        description="a categorical column's catch-all category, one of its `categories`: a value not in the list "
        "is read as this one instead of failing its row",
    )

    @model_validator(mode="before")
    @classmethod
    def _draft_placeholder(cls, data: object) -> object:
        """A value `privflow schema draft` left for the data owner (DRAFT_PLACEHOLDER) refuses the schema by
        name: as a category it would otherwise load as a category of that text."""
        if not isinstance(data, dict):
            return data
        left = [
            f
            for f in ("bounds", "categories", "labels")
            if isinstance(data.get(f), list | tuple) and DRAFT_PLACEHOLDER in data[f]
        ]
        if left:
            raise ValueError(
                f"column '{data.get('name', '?')}': its {' and '.join(left)} are a draft placeholder to fill"
                f" ({DRAFT_PLACEHOLDER!r}, written by `privflow schema draft` without "
                "--epsilon): replace them with public values (the data's documentation, domain knowledge), or draft "
                "again with --epsilon to fill them by DP"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> Column:
        self._check_tail_fields()
        stray = [f for f, types in _APPLIES.items() if getattr(self, f) is not None and self.type not in types]
        if stray:
            types = " and ".join(_APPLIES[stray[0]])
            raise ValueError(f"column '{self.name}' is {self.type}; '{stray[0]}' applies to {types} columns only")
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
            if self.decimals is not None:
                self._check_decimals(low, high)
        elif self.type in TEMPORAL_TYPES:
            self._check_temporal()
        elif self.type == "boolean":
            self._only("labels", "nullable")
            labels = self.true_false
            if len(labels) != 2:
                raise ValueError(
                    f"column '{self.name}' is boolean; 'labels' must be two texts [true, false] as written in the "
                    f"data, got {list(labels)}"
                )
            if any(not t.strip() for t in labels):
                raise ValueError(f"column '{self.name}': a boolean label cannot be empty (an empty field is missing)")
            _refuse_spaced(labels, f"column '{self.name}': labels")
            if labels[0].casefold() == labels[1].casefold():
                raise ValueError(
                    f"column '{self.name}': labels {list(labels)} are the same text (they are matched without "
                    "regard to letter case)"
                )
        elif self.type == "ignore":
            self._only("nullable")
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

    def _check_tail_fields(self) -> None:
        """`on_out_of_bounds` only where there are bounds, `other` only on a categorical column and one of its
        categories."""
        if self.on_out_of_bounds is not None and self.type not in BOUNDED_TYPES:
            raise ValueError(
                f"column '{self.name}' is {self.type}; 'on_out_of_bounds' applies to numeric, integer, date and "
                "datetime columns only (the ones with bounds)"
            )
        if self.other is None:
            return
        if self.type != "categorical":
            raise ValueError(
                f"column '{self.name}' is {self.type}; 'other' applies to categorical columns only"
                + (" (a boolean's two labels are its whole list)" if self.type == "boolean" else "")
            )
        if self.other not in (self.categories or ()):
            raise ValueError(
                f"column '{self.name}': other {self.other!r} is not one of its categories {list(self.categories or ())}"
                "; declare it among the categories too (values not in the list are read as it)"
            )

    @field_validator("other", mode="before")
    @classmethod
    def _other_text(cls, v: object, info: ValidationInfo) -> object:
        """`other` as written in the data: a number becomes its text; a YAML boolean or null is refused."""
        if v is None or isinstance(v, str):
            return v
        try:
            return yaml_strings([v], "other")[0]  # type: ignore[index]
        except ValueError as exc:
            raise ValueError(f"column '{info.data.get('name', '?')}': {exc}") from None

    def _only(self, *fields: str) -> None:
        """Refuse the numeric and categorical fields on a column of a type that takes only `fields`."""
        given = [
            f
            for f, unset in (("bounds", None), ("categories", None), ("transform", "none"), ("atoms", ()))
            if f not in fields and getattr(self, f) != unset
        ]
        if given:
            raise ValueError(f"column '{self.name}' is {self.type}; '{given[0]}' does not apply")

    def _check_decimals(self, low: float, high: float) -> None:
        d = int(self.decimals or 0)  # a whole number in 0..MAX_DECIMALS (`_whole`)
        q = 10.0**d
        if math.ceil(low * q) > math.floor(high * q):
            raise ValueError(
                f"column '{self.name}': no value with {d} decimal(s) lies within its bounds {list(self.bounds or ())}"
            )

    def _check_temporal(self) -> None:
        self._only("bounds", "atoms", "nullable")
        if self.bounds is None:
            example = "['2015-01-01', '2024-12-31']" if self.type == "date" else "['2020-01-01T00:00:00', ...]"
            raise ValueError(f"column '{self.name}' is {self.type} and needs public bounds [low, high], e.g. {example}")
        fmt = self.time_format
        if not fmt.strip() or "%" not in fmt:
            raise ValueError(f"column '{self.name}': format {fmt!r} is not a strftime format such as '%Y-%m-%d'")
        if any(z in fmt for z in ("%z", "%Z", "%:z")):
            raise ValueError(
                f"column '{self.name}': format {fmt!r} has a time zone; privflow reads {self.type}s without one, "
                "so write them in one time zone without its offset"
            )
        low, high = (int(b) for b in self.bounds)
        step = self.step
        if low // step >= high // step:
            unit = "day" if self.type == "date" else self.granularity or "second"
            raise ValueError(
                f"column '{self.name}': bounds must be [low, high] with more than one {unit} between them, "
                f"got {self.bound_texts}"
            )
        for b in (low, high):
            text = self._format_number(b)
            if text is None or self.time_units(text) != b // step:
                unit = "day" if self.type == "date" else self.granularity or "second"
                raise ValueError(
                    f"column '{self.name}': format {fmt!r} does not write and read back its bound "
                    f"{self._iso(b)} to the {unit} (wrote {text!r}); use a format that holds the whole {self.type}"
                )
        outside = [self._iso(int(a)) for a in self.atoms if not low <= a <= high]
        if outside:
            raise ValueError(f"column '{self.name}': atoms {outside} lie outside its bounds {self.bound_texts}")
        off = [self._iso(int(a)) for a in self.atoms if int(a) % step]
        if off:
            raise ValueError(
                f"column '{self.name}': atoms {off} are not whole {self.granularity}s (its granularity); "
                "give them to the granularity"
            )
        if len(set(self.atoms)) != len(self.atoms):
            raise ValueError(f"column '{self.name}': atoms are not unique")

    @field_validator("type", mode="before")
    @classmethod
    def _type(cls, v: object, info: ValidationInfo) -> object:
        v = TYPE_ALIASES.get(v, v) if isinstance(v, str) else v
        if isinstance(v, str) and v not in COLUMN_TYPES:
            raise ValueError(
                f"column '{info.data.get('name', '?')}': type '{v}' is not one of "
                f"{', '.join(COLUMN_TYPES)} (or id, which means ignore)"
            )
        return v

    @field_validator("bounds", "atoms", mode="before")
    @classmethod
    def _times(cls, v: object, info: ValidationInfo) -> object:
        """A temporal column's bounds and atoms from ISO text (or YAML's dates) to `time_number`."""
        kind, name = info.data.get("type"), info.data.get("name", "?")
        if kind not in TEMPORAL_TYPES or not isinstance(v, list | tuple):
            return v
        if info.field_name == "bounds" and len(v) != 2:
            raise ValueError(f"column '{name}': bounds must be two {kind}s [low, high], got {list(v)}")
        return tuple(_iso_time(x, kind, name) for x in v)

    @field_serializer("bounds", "atoms")
    def _times_text(self, v: tuple[float, ...] | None) -> Any:
        """A temporal column's bounds and atoms written back as ISO text."""
        if v is None or self.type not in TEMPORAL_TYPES:
            return v
        return tuple(self._iso(int(x)) for x in v)

    @field_validator("categories", mode="before")
    @classmethod
    def _as_strings(cls, v: object) -> object:
        return yaml_strings(v, "categories")

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, v: object, info: ValidationInfo) -> object:
        name = info.data.get("name", "?")
        if v is not None and not isinstance(v, list | tuple):
            raise ValueError(f"column '{name}': labels must be a list [true text, false text], got {v!r}")
        try:
            return yaml_strings(v, "labels")
        except ValueError as exc:
            raise ValueError(f"column '{name}': {exc}") from None

    @field_validator("decimals", mode="before")
    @classmethod
    def _whole(cls, v: object, info: ValidationInfo) -> object:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_DECIMALS):
            raise ValueError(
                f"column '{info.data.get('name', '?')}': decimals must be a whole number from 0 to {MAX_DECIMALS}, "
                f"got {v!r}"
            )
        return v

    @field_validator("granularity", mode="before")
    @classmethod
    def _unit(cls, v: object, info: ValidationInfo) -> object:
        if v is not None and v not in GRANULARITY_SECONDS:
            raise ValueError(
                f"column '{info.data.get('name', '?')}': granularity must be one of "
                f"{', '.join(GRANULARITY_SECONDS)}, got {v!r}"
            )
        return v

    @field_validator("format", mode="before")
    @classmethod
    def _text_format(cls, v: object, info: ValidationInfo) -> object:
        if v is not None and not isinstance(v, str):
            raise ValueError(
                f"column '{info.data.get('name', '?')}': format must be a strftime text such as '%Y-%m-%d', got {v!r}"
            )
        return v

    @field_validator("atoms", mode="before")
    @classmethod
    def _numbers(cls, v: object, info: ValidationInfo) -> object:
        """Atoms are numbers as YAML writes them: a boolean (unquoted yes/true) or text is refused,
        not turned into 1.0 or parsed (a temporal column's are converted by `_times` first)."""
        if isinstance(v, list | tuple) and info.data.get("type") not in TEMPORAL_TYPES:
            odd = [x for x in v if isinstance(x, bool) or not isinstance(x, int | float)]
            if odd:
                raise ValueError(f"atoms must be numbers, got {', '.join(repr(x) for x in odd)}")
        return v

    @property
    def is_categorical(self) -> bool:
        return self.type == "categorical"

    # set by lowering a date or datetime column (privflow/data/lowering.py), never read from a file
    _calendar: int | None = PrivateAttr(default=None)

    @property
    def modelled(self) -> bool:
        """Whether the model takes this column as it is (not lowered first, not ignored)."""
        return self.type in MODELLED_TYPES

    @property
    def calendar_unit(self) -> int | None:
        """An integer column lowered from a date or datetime: the seconds one of its units holds
        (86400 for a date); None for every other column. The copula codec models such a column
        through its calendar parts (privflow/data/calendar.py)."""
        return self._calendar

    def as_calendar(self, unit_seconds: int) -> Column:
        """This integer column, marked as counting units of `unit_seconds` since 1970-01-01."""
        if self.type != "integer" or unit_seconds <= 0 or 86_400 % unit_seconds:
            raise ValueError(f"column '{self.name}': a calendar column is integer with a unit that divides a day")
        out = self.model_copy()
        out._calendar = int(unit_seconds)
        return out

    # -- the lowered types' public facts (privflow/data/lowering.py) --------------------------------

    @property
    def true_false(self) -> tuple[str, ...]:
        """A boolean column's (true text, false text)."""
        return self.labels if self.labels is not None else DEFAULT_LABELS

    @property
    def time_format(self) -> str:
        """A temporal column's strftime/strptime format."""
        return self.format if self.format is not None else DEFAULT_FORMATS[self.type]

    @property
    def step(self) -> int:
        """How many of a temporal column's held numbers (days, seconds) make one modelled unit:
        1 for a date (a day), the granularity's seconds for a datetime."""
        return 1 if self.type == "date" else GRANULARITY_SECONDS[self.granularity or "second"]

    @property
    def bound_texts(self) -> list[str]:
        """A temporal column's bounds as ISO text."""
        return [self._iso(int(b)) for b in self.bounds or ()]

    def time_units(self, text: str) -> int | None:
        """`text` read with the column's format, as modelled units since 1970-01-01 (days; a
        datetime's granularity), or None when it does not parse (never raises)."""
        try:
            value = datetime.strptime(text, self.time_format)
        except (ValueError, TypeError, OverflowError):
            return None
        return time_number(value, self.type) // self.step

    def time_text(self, units: int) -> str:
        """Modelled units back to text in the column's format (the inverse of `time_units`)."""
        return time_value(int(units) * self.step, self.type).strftime(self.time_format)

    def _format_number(self, number: int) -> str | None:
        try:
            return time_value(number, self.type).strftime(self.time_format)
        except (ValueError, OverflowError):
            return None

    def _iso(self, number: int) -> str:
        value = time_value(number, self.type)
        return value.isoformat() if self.type == "date" else cast(datetime, value).isoformat(timespec="seconds")


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
    max_line_bytes: int = Field(
        1_048_576,
        ge=1,
        description="public cap on one row's size in bytes (a CSV line without its line ending; a Parquet "
        "row's text values together): a longer row is a failing row, read without holding it, whatever the "
        "rest of the file holds. Default 1 MiB",
    )
    on_out_of_bounds: OutOfBounds = Field(
        "fail",
        description="what a value past a numeric, integer, date or datetime column's bounds does, for every such "
        "column that does not say (its own `on_out_of_bounds`): `fail` (default: the row fails; a hand-written "
        "bound may be a validity rule) or `clamp` (the value is set to the nearest bound and the row is kept; "
        "how many rows were clamped is a DP count of the validation gate). A drafted schema writes `clamp`",
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

    draft_run: str | None = Field(
        None,
        min_length=1,
        description="the privacy ledger's run that drafted this schema by DP (`privflow schema draft "
        "--epsilon`): a model trained on it reports its epsilon composed with that run's (privacy rule 9: "
        "the schema's bounds and lists came from the rows). Set by the draft; remove it only for a schema "
        "whose every value the data owner restated from public knowledge",
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


# -- rules between columns: declared here, checked against the columns and evaluated in
# privflow/data/rules.py ----------------------------------------------------------------------

RuleOp = Literal[">=", ">", "<=", "<", "==", "!="]
RULE_KINDS = ("inequality", "combinations", "conditional", "missing_together")


class _RulePart(BaseModel):
    """A rule or a part of one: frozen, no unknown field, written without its unset (None) fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _compact(self, handler: Any) -> Any:
        out = handler(self)
        return {k: v for k, v in out.items() if v is not None} if isinstance(out, dict) else out


def _label_list(v: object, field: str) -> object:
    """Labels as written in the data (`yaml_strings`); one bare value is a list of one."""
    if isinstance(v, str | int | float) and not isinstance(v, bool):
        v = [v]
    return yaml_strings(v, field)


def _shown_values(values: Sequence[str]) -> str:
    return f"= {values[0]}" if len(values) == 1 else f"in [{', '.join(values)}]"


class InequalityRule(_RulePart):
    """`low <= high` on every row (`strict`: `low < high`): two numeric or integer columns, two date
    columns, or two datetime columns of one granularity (SDV's Inequality)."""

    kind: Literal["inequality"]
    low: str = Field(min_length=1)
    high: str = Field(min_length=1)
    strict: bool = False
    name: str | None = Field(default=None, min_length=1, description="the rule's name in reports (default: its text)")

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.low, self.high)

    @property
    def label(self) -> str:
        return self.name or f"{self.low} {'<' if self.strict else '<='} {self.high}"


class CombinationsRule(_RulePart):
    """Only the listed combinations of values of several categorical (or boolean) columns appear
    together (SDV's FixedCombinations, with the combinations declared, not read off the rows)."""

    kind: Literal["combinations"]
    columns: tuple[str, ...] = Field(min_length=2)
    allowed: tuple[tuple[str, ...], ...] = Field(min_length=1)
    name: str | None = Field(default=None, min_length=1, description="the rule's name in reports (default: its text)")

    @field_validator("allowed", mode="before")
    @classmethod
    def _texts(cls, v: object) -> object:
        if not isinstance(v, list | tuple):
            return v
        bad = [x for x in v if not isinstance(x, list | tuple)]
        if bad:
            raise ValueError(
                f"each allowed combination is a list of values, one per column (e.g. [US, USD]), got {bad[0]!r}"
            )
        return tuple(yaml_strings(list(x), "an allowed combination") for x in v)

    @property
    def label(self) -> str:
        return self.name or f"combinations of {', '.join(self.columns)}"


class RuleWhen(_RulePart):
    """A conditional rule's `when`: the row's value of a categorical (or boolean) column is one of `one_of`."""

    column: str = Field(min_length=1)
    one_of: tuple[str, ...] = Field(min_length=1)

    @field_validator("one_of", mode="before")
    @classmethod
    def _texts(cls, v: object) -> object:
        return _label_list(v, "when.one_of")

    @property
    def text(self) -> str:
        return f"{self.column} {_shown_values(self.one_of)}"


class RuleThen(_RulePart):
    """A conditional rule's `then`: a categorical (or boolean) column's value is one of `one_of`, or a
    numeric, integer, date or datetime column's value compares to `value` by `op`."""

    column: str = Field(min_length=1)
    one_of: tuple[str, ...] | None = None
    op: RuleOp | None = None
    value: int | float | str | None = None

    @field_validator("one_of", mode="before")
    @classmethod
    def _texts(cls, v: object) -> object:
        return None if v is None else _label_list(v, "then.one_of")

    @field_validator("value", mode="before")
    @classmethod
    def _one_value(cls, v: object) -> object:
        """A number, or a date or datetime as ISO text (YAML's unquoted dates become that text)."""
        if isinstance(v, bool):
            raise ValueError(
                f"then.value must be a number, or a date or datetime as ISO text, got {v!r} (YAML reads unquoted "
                "yes, no, true, false as booleans)"
            )
        if isinstance(v, datetime):
            return v.isoformat(timespec="seconds")
        if isinstance(v, date):
            return v.isoformat()
        return v

    @model_validator(mode="after")
    def _either(self) -> RuleThen:
        compare = self.op is not None or self.value is not None
        if self.one_of is not None and compare:
            raise ValueError(
                f"then on column '{self.column}' gives both `one_of` and `op`/`value`; give `one_of` (a categorical "
                "column's values) or `op` and `value` (a comparison), not both"
            )
        if self.one_of is None and (self.op is None or self.value is None):
            raise ValueError(
                f"then on column '{self.column}' needs `one_of: [...]` (a categorical column's values) or both `op` "
                "(one of >=, >, <=, <, ==, !=) and `value` (a comparison)"
            )
        return self

    @property
    def text(self) -> str:
        if self.one_of is not None:
            return f"{self.column} {_shown_values(self.one_of)}"
        return f"{self.column} {self.op} {self.value}"


class ConditionalRule(_RulePart):
    """`then` holds on every row where `when` does (e.g. if status is HU then wind >= 64)."""

    kind: Literal["conditional"]
    when: RuleWhen
    then: RuleThen
    name: str | None = Field(default=None, min_length=1, description="the rule's name in reports (default: its text)")

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.when.column, self.then.column)

    @property
    def label(self) -> str:
        return self.name or f"if {self.when.text} then {self.then.text}"


class MissingTogetherRule(_RulePart):
    """The columns are all missing or all present on every row."""

    kind: Literal["missing_together"]
    columns: tuple[str, ...] = Field(min_length=2)
    name: str | None = Field(default=None, min_length=1, description="the rule's name in reports (default: its text)")

    @property
    def label(self) -> str:
        return self.name or f"{', '.join(self.columns)} missing together"


Rule = Annotated[InequalityRule | CombinationsRule | ConditionalRule | MissingTogetherRule, Field(discriminator="kind")]


class Schema(BaseModel):
    """A table's public schema; `target` names the label used by utility diagnostics and
    `target_positive` the target's class they score as positive."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    dataset: DatasetInfo
    columns: tuple[Column, ...] = Field(min_length=1)
    target: str | None = None
    target_positive: str | None = Field(
        None,
        description="the target's class that binary utility metrics (F1, AUROC, AP) score as positive, one of "
        "its categories (a boolean target's labels); without it a binary target scores its last declared class "
        "(named in the report) and a target of more classes reports one-vs-rest macro averages",
    )
    rules: tuple[Rule, ...] = Field(
        default=(),
        description="public rules between columns that every released row meets (privflow/data/rules.py): "
        "inequality (low <= high), combinations (only the listed combinations of categorical values), "
        "conditional (when a categorical value, then a comparison or a set of values) and missing_together. "
        "The sampler redraws rows that break one; `privflow check` counts the real rows that do",
    )

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
            if col.type == "boolean":
                tokens = {t.casefold() for t in self.dataset.missing_values}
                both = [t for t in col.true_false if t.casefold() in tokens]
                if both:
                    raise ValueError(
                        f"{both} of column '{col.name}' is both a boolean label and a dataset.missing_values token; "
                        "a value cannot be both, so drop it from one of the two"
                    )
        if all(c.type == "ignore" for c in self.columns):
            raise ValueError("every column is of type ignore; at least one column must be modelled")
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
            target = self.column(self.target)
            if target.type == "ignore":
                raise ValueError(
                    f"target '{self.target}' is of type ignore: it is not modelled, so it cannot be the target"
                )
            if target.type not in ("categorical", "boolean"):
                raise ValueError(f"target '{self.target}' must be categorical (or boolean)")
            if target.is_categorical and len(target.categories or ()) + (1 if target.nullable else 0) < 2:
                raise ValueError(
                    f"target '{self.target}' has a single class; a target needs at least two (two categories, "
                    "or one and `nullable: true`), so declare the other classes or drop `target`"
                )
        if self.target_positive is not None:
            if self.target is None:
                raise ValueError(
                    f"target_positive {self.target_positive!r} is set but the schema has no `target`; name the "
                    "target column too, or drop target_positive"
                )
            classes = self.target_classes
            if self.target_positive not in classes:
                raise ValueError(
                    f"target_positive {self.target_positive!r} is not one of target '{self.target}' classes "
                    f"{classes}; write it as the category (a boolean target's label) appears in the schema"
                )
        if self.rules:
            from privflow.data.rules import check_rules

            check_rules(self)
        return self

    @field_validator("rules", mode="before")
    @classmethod
    def _rule_kinds(cls, v: object) -> object:
        """Each rule names its `kind` (one of RULE_KINDS), said by the rule's place in the list."""
        if not isinstance(v, list | tuple):
            return v
        for i, rule in enumerate(v, 1):
            kind = rule.get("kind") if isinstance(rule, dict) else getattr(rule, "kind", None)
            if kind not in RULE_KINDS:
                got = f", got {kind!r}" if kind is not None else ""
                raise ValueError(
                    f"rule {i} needs a `kind`, one of {', '.join(RULE_KINDS)}{got} (each rule is a mapping such as "
                    "{kind: inequality, low: start, high: end})"
                )
        return v

    @model_serializer(mode="wrap")
    def _no_empty_rules(self, handler: Any) -> Any:
        """A schema without rules is written as before (no `rules: []`)."""
        out = handler(self)
        if isinstance(out, dict) and not self.rules:
            out.pop("rules", None)
        return out

    @field_validator("target_positive", mode="before")
    @classmethod
    def _positive_text(cls, v: object) -> object:
        if v is None or isinstance(v, str):
            return v
        return yaml_strings([v], "target_positive")[0]  # type: ignore[index]

    @property
    def target_classes(self) -> list[str]:
        """The target's declared classes in order: a categorical target's categories, a boolean
        target's labels (true, false); empty without a target."""
        if self.target is None:
            return []
        col = self.column(self.target)
        return list(col.true_false if col.type == "boolean" else col.categories or ())

    def out_of_bounds(self, col: Column) -> OutOfBounds | None:
        """What a value of `col` past its bounds does (its own `on_out_of_bounds`, else the
        dataset's); None for a column without bounds."""
        if col.type not in BOUNDED_TYPES:
            return None
        return col.on_out_of_bounds or self.dataset.on_out_of_bounds

    def clamps(self, col: Column) -> bool:
        """Whether a value of `col` past its bounds is clamped to the nearest bound (not failing its row)."""
        return self.out_of_bounds(col) == "clamp"

    @property
    def tails_kept(self) -> bool:
        """Whether any column clamps out-of-bounds values or sends unlisted categories to `other`."""
        return any(self.clamps(c) or c.other is not None for c in self.columns)

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
        columns a flow models when the target head takes the target (privflow/data/target_head.py).
        Without the rules: they are read on whole rows, by the codec of the whole schema."""
        self.column(name)
        dropped = self.target == name
        return Schema(
            dataset=self.dataset,
            columns=tuple(c for c in self.columns if c.name != name),
            target=None if dropped else self.target,
            target_positive=None if dropped else self.target_positive,
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
            problems = "; ".join(f"{_error_place(tuple(e['loc']))}: {e['msg']}" for e in errors)
            raise SchemaError(f"{source} is invalid: {problems}.") from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _error_place(loc: tuple[Any, ...]) -> str:
    """Where a problem is, as `validated` says it: the fields' path ('columns.2.bounds'), a rule by
    its place counted from 1 and its kind ('rule 2 (inequality).low', as `check_rules` counts them)."""
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
        kind = f" ({loc[2]})" if len(loc) >= 3 and loc[2] in RULE_KINDS else ""
        rest = loc[3:] if kind else loc[2:]
        return f"rule {loc[1] + 1}{kind}" + "".join(f".{x}" for x in rest)
    return ".".join(str(x) for x in loc) or "schema"
