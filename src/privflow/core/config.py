"""Typed run configuration, readable from YAML and overridable from the CLI.

Defaults give a working run on the bundled demo (Adult at epsilon=1, delta=1e-5).
Everything here is public: none of it is read off the private rows.
"""

from __future__ import annotations

import math
import posixpath
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from privflow.core.errors import ConfigError
from privflow.core.limits import MAX_NATS
from privflow.core.source_uri import as_data_source
from privflow.core.yaml_file import read_mapping

# Fewest data rows a run or a pretraining takes (the selection split sets the rest: SelectConfig.min_rows)
MIN_ROWS_FLOOR = 10
# `privflow dpad`: a part with fewer training rows trains no flow and votes "normal" on every query
DPAD_MIN_PART_ROWS = 10
# Sanity bounds on settings that go into float32 arithmetic or 64-bit hashes: past them a run
# would overflow after spending (lr 1e300 did, in the optimizer; seed -5 in the row hash).
MAX_LR = 10.0  # a step size over 10 diverges with Adam or SGD on these flows
MAX_CLIP = 1e6  # a clipping norm past any gradient these flows give
MAX_SEED = 2**63 - 1  # torch's and numpy's seeds, and polars' row-hash salts


def promotion_key(value: str) -> str:
    """`--promote if-better` or `promotion: If_Better` -> the config's value, `if_better`."""
    return value.strip().lower().replace("-", "_")


# When the registry alias moves to a new version; the CLI's spelling (`if-better`) is accepted
# wherever it is written (the run config, a schema's dataset section, the API, YAML).
Promotion = Annotated[
    Literal["if_better", "always", "never"],
    BeforeValidator(lambda v: promotion_key(v) if isinstance(v, str) else v),
]


class _Section(BaseModel):
    # no infinite or NaN setting anywhere: `lr: .inf` passes gt=0 and trains nothing, epochs: .inf
    # has no step count
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PrivacyConfig(_Section):
    """The run's total (epsilon, delta) and the standalone epsilon shares of the small stages.

    DP-SGD takes what remains: its noise is calibrated so that the tight (PLD) composition
    of every stage lands at or just under the target (privacy/accounting/plan.py).
    """

    epsilon: float = Field(1.0, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    gate_share: float = Field(0.02, gt=0, lt=1, description="share for the validation gate's DP count of failing rows")
    stats_share: float = Field(0.05, ge=0, lt=1)
    prior_share: float = Field(0.05, ge=0, lt=1)
    select_share: float = Field(0.03, ge=0, lt=1)


class ModelConfig(_Section):
    """Which flow to train and its shape (models/)."""

    name: Literal["dphflow", "maf"] = "dphflow"
    blocks: int = Field(4, ge=1, le=32)
    hidden: int = Field(64, ge=4, le=4096)
    spline_bins: int = Field(8, ge=2, le=64)
    spline_bound: float = Field(4.0, gt=0)
    dequantization: Literal["uniform", "variational"] = "uniform"
    linear: Literal["lu", "lowrank", "none"] = "lu"
    rank: int = Field(1, ge=1)
    prior: Literal["normal", "mog"] = "normal"
    mog_components: int = Field(5, ge=1, le=64)
    mog_iterations: int = Field(10, ge=1, le=200)


class TrainConfig(_Section):
    """DP-SGD/DP-Adam with Poisson sampling (privacy/dpsgd/dp_sgd.py)."""

    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(3e-3, gt=0, le=MAX_LR)
    batch_size: int = Field(512, ge=1, description="expected Poisson batch size")
    epochs: float = Field(8.0, gt=0)
    max_grad_norm: float = Field(1.0, gt=0, le=MAX_CLIP)
    clipping: Literal["flat", "per_layer", "per_unit", "sparsify"] = Field(
        "flat",
        description="flat by default: per-layer clipping (DP-HFlow) made DP-Adam diverge on the pinwheel "
        "density even under little noise, where flat clipping trained steadily; on Adult both give the same "
        "utility",
    )
    sparsity: float = Field(0.5, ge=0, lt=1)
    checkpoint_every: int = Field(50, ge=1)
    min_effective_batch: float = Field(
        100.0,
        ge=0,
        description="with DP marginals, train the flow only when batch / noise multiplier reaches this "
        "(tasks/run_plan.py: flow_can_learn); below it the marginals take the flow's budget and the "
        "release is their independent copula; 0 always trains",
    )
    ema_decay: float = Field(
        0.99,
        ge=0,
        lt=1,
        description="checkpoints hold the exponential moving average of the DP iterates "
        "(privacy/dpsgd/averaging.py; post-processing, free); 0 keeps the raw iterates",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = Field(0, ge=0, le=MAX_SEED, description="public seed of the model's initial weights and the split")
    threads: int = Field(
        1,
        ge=1,
        description="torch intra-op threads for CPU training; these layers are small, so on a shared CPU "
        "more threads mostly wait on each other and one is fastest",
    )
    workers: int = Field(
        1,
        ge=1,
        description="data-parallel DP-SGD processes under torchrun (privacy/dpsgd/distributed.py; gloo on CPU, "
        "NCCL with one GPU each); the same steps, noise and privacy event as one process",
    )


class GateConfig(_Section):
    """The validation gate (privacy/mechanisms/validation_gate.py): a DP count of failing rows
    against a public limit, a fraction of the schema's expected_rows (raised to the noise
    floor where that fraction is too small for the gate's epsilon to resolve).

    strict: the run stops when the DP count passes `strict_max_failing`; below it the few
    failing rows are dropped (and listed only in the curator-only report). quarantine: failing
    rows are set aside to the curator-only quarantine file; the run stops only when the DP
    count passes `quarantine_max_failing`.
    """

    strict_max_failing: float = Field(0.01, ge=0, lt=1)
    quarantine_max_failing: float = Field(0.5, ge=0, lt=1)
    false_stop: float | None = Field(
        None,
        gt=0,
        lt=0.5,
        description="largest probability that a clean table of the expected size is stopped by the gate's noise "
        "(unset: the gate's own FALSE_STOP, 1e-3); sets the noise floor its limits are moved to (smaller: fewer "
        "chance stops, but more bad rows go unseen on small tables)",
    )


class MarginalsConfig(_Section):
    """DP marginals under the flow (privacy/mechanisms/dp_marginals.py, privflow/data/copula.py).

    When enabled, `share` of epsilon buys one Gaussian release of every column's histogram over
    public cells; rows are encoded through those DP CDFs (a uniform copula), the flow learns
    the dependence, and sampled rows decode through the inverse, so synthetic marginals match
    the DP ones by construction. Versions trained with it are compared for promotion only with
    versions that share their marginals.

    On by default, with half of epsilon: against the flow alone it brings the synthetic
    marginals far closer to the real ones and improves the pairwise (Kendall-tau) dependence,
    at no cost in classifier utility; a smaller share leaves the marginals noisier
    (benchmarks/results/peers.md: the `flow-nomarg` ablation). Small tables get the whole
    budget for the marginals instead (`TrainConfig.min_effective_batch`).
    """

    enabled: bool = True
    share: float = Field(0.5, gt=0, lt=1)
    grid_bins: int | Literal["auto"] = Field(
        "auto",
        description="cells of a numeric column's grid (the leaves of its tree of block counts); auto: "
        "the default grid, 640 (privflow/data/copula.py DEFAULT_GRID_BINS), or 512 below 1,000 expected rows "
        "(privflow/tasks/marginals_stage.py)",
    )

    @field_validator("grid_bins")
    @classmethod
    def _grid(cls, v: int | str) -> int | str:
        if v != "auto" and not 8 <= int(v) <= 4096:
            raise ValueError("grid_bins must be 'auto' or an integer in [8, 4096]")
        return v


class HeadConfig(_Section):
    """The target head (privflow/data/target_head.py; privacy/mechanisms/dp_head.py).

    When the schema declares a categorical `target`, the flow models every other column and a
    softmax regression trained by DP-SGD on their public encoding models the target given them,
    with `share` of epsilon; with DP marginals its class rates are calibrated to the released
    ones (post-processing). Numeric columns enter through a hat basis of `numeric_knots` knots,
    on their released marginal's CDF with DP marginals (`ranked`), else on their public bounds (a
    piecewise-linear effect per column). Its effect:
    benchmarks/results/peers.md (with and without the head: the `flow-nohead` ablation) and
    benchmarks/results/label_ceiling.md. Off, the flow models the target too.
    """

    enabled: bool = True
    share: float = Field(0.2, gt=0, lt=1, description="share of epsilon for the head's DP-SGD")
    batch_size: int | Literal["auto"] = Field(
        "auto",
        description="expected batch; auto: expected_rows / 64, at least 256, at most a quarter of the table and 4,096",
    )
    steps: int = Field(200, ge=1, le=100_000)
    lr: float = Field(0.02, gt=0, le=MAX_LR)
    max_grad_norm: float = Field(1.0, gt=0, le=MAX_CLIP)
    ema_decay: float = Field(0.95, ge=0, lt=1, description="released weights: the EMA of the iterates (free)")
    numeric_knots: int = Field(
        5,
        ge=0,
        le=64,
        description="numeric columns enter the head through a hat basis of this many knots on their public "
        "bounds (a piecewise-linear effect, fixed by the schema); 0: linearly",
    )

    ranked: bool = Field(
        True,
        description="with DP marginals, numbers enter the head as their released marginal's CDF (their rank: the "
        "knots at the marginal's quantiles, privflow/data/marginal_ranks.py) instead of scaled by the public bounds",
    )

    @field_validator("numeric_knots")
    @classmethod
    def _knots(cls, v: int) -> int:
        if v == 1:
            raise ValueError("numeric_knots must be 0 (linear) or at least 2")
        return v

    @field_validator("batch_size")
    @classmethod
    def _batch(cls, v: int | str) -> int | str:
        if v != "auto" and int(v) < 1:
            raise ValueError("batch_size must be 'auto' or a positive integer")
        return v


class SelectConfig(_Section):
    """Report-Noisy-Max over checkpoints on the clipped validation log-likelihood."""

    top_k: int = Field(1, ge=1)
    validation_fraction: float = Field(0.1, gt=0, lt=0.5)
    max_validation_rows: int = Field(
        100_000,
        ge=2,
        description="the selection split expects at most this many rows: on a table whose public "
        "expected_rows * validation_fraction exceeds it, the share falls to max_validation_rows / "
        "expected_rows, so scoring the checkpoints takes bounded time (the other rows train)",
    )
    score: Literal["relative", "absolute"] = Field(
        "relative",
        description="relative: each row's log-likelihood minus its median over checkpoints, clipped to "
        "+-relative_clip (sensitivity relative_clip); absolute: clipped to [score_low, score_high]",
    )
    relative_clip: float = Field(1.0, gt=0, le=MAX_NATS, description="nats; the relative score's per-row bound")
    max_candidates: int = Field(
        16, ge=1, description="checkpoints scored by selection: evenly spaced, the last always among them"
    )
    include_start: bool = Field(
        True,
        description="the flow before DP-SGD (DP statistics only: independent columns; with DP marginals, "
        "exactly the independent copula) is a candidate, so selection falls back to it when training "
        "did not help (small tables); the report says so",
    )
    score_low: float = Field(-20.0, ge=-MAX_NATS, description="per-row log-likelihood clipped below here (nats)")
    score_high: float = Field(10.0, le=MAX_NATS, description="per-row log-likelihood clipped above here (nats)")

    @model_validator(mode="after")
    def _bounds(self) -> SelectConfig:
        if not self.score_low < self.score_high:
            raise ValueError("score_low must be below score_high")
        if self.top_k > self.max_candidates:
            raise ValueError(
                f"top_k ({self.top_k}) checkpoints cannot be chosen among max_candidates ({self.max_candidates}); "
                "lower top_k or raise max_candidates"
            )
        return self

    def fraction(self, expected_rows: int | None) -> float:
        """The selection split's share of the rows: validation_fraction, lowered so that the
        split expects at most max_validation_rows of the schema's public expected_rows (never
        of the private row count, which would make the split, and every score, leak it)."""
        if not expected_rows:
            return self.validation_fraction
        return min(self.validation_fraction, self.max_validation_rows / expected_rows)

    def min_rows(self, expected_rows: int | None) -> int:
        """Public minimum number of data rows: the selection split must expect >= 2 rows, and
        never fewer than MIN_ROWS_FLOOR rows overall."""
        return max(math.ceil(2.0 / self.fraction(expected_rows)), MIN_ROWS_FLOOR)


class StreamConfig(_Section):
    """Reading the table in chunks, for tables larger than memory (privflow/data/chunked.py, tasks/stream.py).

    A streamed run reads the Parquet input `chunk_rows` rows at a time, twice (validation with
    the DP marginals' counts and the head's rows, then the encoding), keeps the encoded rows
    in files of the run's curator folder (deleted when it ends) and gathers each DP-SGD step's
    Poisson sample from them: memory stays about a chunk, whatever the table's size. The
    curator-only diagnostics score a sample of about `diagnostic_rows` rows. auto: streamed
    when the input is Parquet and the schema's public expected_rows exceeds `auto_rows`.
    """

    enabled: bool | Literal["auto"] = "auto"
    auto_rows: int = Field(1_000_000, ge=1, description="auto: stream a Parquet input above this many expected rows")
    chunk_rows: int = Field(
        65_536,
        ge=1_000,
        le=10_000_000,
        description="rows read, validated and encoded at a time; larger chunks raise peak memory without "
        "validating faster per row, smaller ones validate slower per row",
    )
    diagnostic_rows: int = Field(50_000, ge=1_000, description="expected rows in the curator diagnostics' sample")


class EvaluateConfig(_Section):
    """Diagnostics for the data owner (not differentially private)."""

    synthetic_rows: int | None = Field(
        None, ge=1, description="default: the schema's public expected_rows (never the private row count)"
    )

    def rows(self, expected_rows: int | None) -> int:
        """Rows of the run's synthetic table: `synthetic_rows`, else the schema's public
        expected_rows, else 10,000 (never the private row count)."""
        return self.synthetic_rows or expected_rows or 10_000

    sampling_seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="public seed of the released synthetic table (reproducible post-processing); "
        "default: drawn from the OS CSPRNG and not recorded",
    )
    fidelity: bool = True
    utility: bool = True
    likelihood: bool = True
    privacy_risk: bool = True
    report: bool = True
    repeats: int = Field(1, ge=1)
    test_data: Path | None = None


class RunConfig(_Section):
    """One training run: data, schema, privacy, model, training, selection, evaluation, registry."""

    # a table file, a folder of Parquet files, or a database URI (a SourceURI: its text masks the
    # password, so params, logs and messages never show it; privflow/data/sources.py reads it)
    data: Path | str
    schema_path: Path
    policy: Literal["strict", "quarantine"] = "strict"
    store: Path = Path(".privflow")
    model_name: str | None = Field(None, description="registered model name; default privflow-<dataset>")
    alias: str = "champion"
    promotion: Promotion = Field(
        "if_better",
        description="when the alias moves to the new version: if_better (default) gives it to the first "
        "version at no cost and afterwards moves it only when a DP comparison with the holder says the new "
        "version is better (tasks/promote.py, its own small epsilon in the ledger); always; or never",
    )
    init_from: str | None = Field(
        None,
        description="warm start: NAME@ALIAS or NAME/VERSION of a registered model whose weights DP training starts "
        "from (tasks/warm_start.py says which parents are allowed and what they cost); the plan then has no DP "
        "statistics or DP prior stage (tasks/run_plan.py)",
    )
    privacy: PrivacyConfig = PrivacyConfig()
    gate: GateConfig = GateConfig()
    marginals: MarginalsConfig = MarginalsConfig()
    head: HeadConfig = HeadConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    select: SelectConfig = SelectConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    stream: StreamConfig = StreamConfig()

    @field_validator("data", mode="plain", json_schema_input_type=Path | str)
    @classmethod
    def _data_source(cls, v: object) -> Path | str:
        """A path stays a Path; a `postgresql://` URI becomes a SourceURI (core/source_uri.py), even
        after a `Path` took a slash out of it (the CLI's option type)."""
        if not isinstance(v, (str, Path)):
            raise ValueError(f"must be a path or a postgresql:// URI, got {type(v).__name__}")
        return as_data_source(v)

    @field_serializer("data", when_used="json")
    def _shown_data(self, v: Path | str) -> str:
        """As text; a database URI with its password masked (the SourceURI's text)."""
        return str(v)

    @field_validator("model_name")
    @classmethod
    def _registrable_name(cls, v: str | None) -> str | None:
        """MLflow's own rules for a registered model's name (mlflow.utils.validation, checked here so
        that a name the registry refuses never gets as far as a run that spends budget), and no '@'
        (privflow reads NAME@ALIAS)."""
        if v is None:
            return v
        norm = posixpath.normpath(v)
        if not v.strip() or any(c in v for c in "/:@") or norm != v or norm == "." or norm.startswith(".."):
            raise ValueError(
                f"{v!r} cannot name a registered model: it must not be blank, contain '/', ':' or '@', or be a "
                "relative path such as '.' or '..'"
            )
        return v

    @field_validator("alias")
    @classmethod
    def _registrable_alias(cls, v: str) -> str:
        """MLflow's rules for an alias: letters, digits, '_' and '-', at most 255 characters, and
        neither 'latest' nor v<number> (both name versions)."""
        if not re.fullmatch(r"[\w\-]{1,255}", v) or v.lower() == "latest" or re.fullmatch(r"[vV]\d+", v):
            raise ValueError(
                f"{v!r} cannot be an alias: use 1 to 255 letters, digits, '_' or '-', and neither 'latest' nor "
                "v<number> (the registry reserves both to name versions), e.g. 'champion'"
            )
        return v

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: object) -> RunConfig:
        raw = read_mapping(path, "Config file", ConfigError)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls.build(**raw)

    @classmethod
    def build(cls, **values: object) -> RunConfig:
        """Validate values into a config; errors become one ConfigError naming each field."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"Invalid run settings: {problems}.") from None
