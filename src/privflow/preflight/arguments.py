"""The run's arguments, before any file is opened: epsilon and delta in range, a sampling seed,
the schema parsed."""

from __future__ import annotations

import math
from numbers import Integral

from privflow.core.config import RunConfig
from privflow.core.errors import ConfigError
from privflow.data.schema import Schema


def check_privacy_parameters(config: RunConfig, schema: Schema | None = None, delta_flag: bool = True) -> None:
    """epsilon and delta finite, positive and in their sane ranges (ConfigError otherwise).
    `delta_flag` False: the command has no --delta (audit), so the advice names the --config key."""
    from privflow.privacy.accounting.plan import MAX_EPSILON

    eps, delta = config.privacy.epsilon, config.privacy.delta
    name = "--delta" if delta_flag else "privacy.delta (the --config YAML's; default 1e-5)"
    given = f"--delta {delta:g}" if delta_flag else f"privacy.delta {delta:g} (the --config YAML's; default 1e-5)"

    def use(value: float) -> str:
        return f"--delta {value:g}" if delta_flag else f"privacy.delta: {value:g} in the --config YAML"

    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
        raise ConfigError(
            f"--epsilon must be a finite number above 0, got {eps}. It is the run's total privacy loss; "
            "typical values are 0.1 to 10."
        )
    if eps > MAX_EPSILON:
        raise ConfigError(
            f"--epsilon {eps:g} is above privflow's limit of {MAX_EPSILON:g}: at such values the guarantee "
            f"says nothing (e^epsilon is astronomically large) and the accountant cannot represent the noise. "
            f"Choose an epsilon of at most {MAX_EPSILON:g}; typical values are 0.1 to 10."
        )
    if not (isinstance(delta, int | float) and math.isfinite(delta) and 0 < delta < 1):
        raise ConfigError(
            f"{name} must lie strictly between 0 and 1, got {delta}; use a value well below 1/(number of "
            "rows), e.g. 1e-5."
        )
    if schema is None:
        return
    rows = schema.dataset.expected_rows
    if rows is not None and delta >= 1.0 / rows:
        raise ConfigError(
            f"{given} is not below 1/expected_rows = {1.0 / rows:.3g} (the schema says about {rows} "
            "rows): with such a delta a mechanism that publishes a random row outright would qualify, so the "
            f"guarantee means little. Use a delta well below {1.0 / rows:.3g}, e.g. {use(nice_delta(rows))}."
        )
    budget = schema.dataset.budget
    if delta > budget.delta:
        raise ConfigError(
            f"{given} is above the total delta budget of dataset '{schema.dataset.name}' "
            f"({budget.delta:g}); one run cannot spend more than the whole budget. Use {use(budget.delta)} "
            "or less."
        )


def nice_delta(rows: int) -> float:
    return 10.0 ** math.floor(math.log10(1.0 / rows) - 1)


def read_schema(config: RunConfig) -> Schema:
    return Schema.from_yaml(config.schema_path)


def check_seed(seed: object, name: str = "--seed") -> int | None:
    """A public sampling seed: None, or a whole number in [0, 2**63) (torch's and numpy's range),
    returned as a Python int (torch takes no numpy integer)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, Integral) or not 0 <= int(seed) < 2**63:
        raise ConfigError(f"{name} must be a whole number from 0 to 2**63 - 1 (or none), got {seed!r}.")
    return int(seed)


__all__ = ["check_privacy_parameters", "check_seed", "nice_delta", "read_schema"]
