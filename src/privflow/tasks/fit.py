"""fit: the one training pipeline, from encoded rows to the released flow(s).

    plan -> DP statistics -> [DP prior] -> DP-SGD -> Report-Noisy-Max -> sample

The train pipeline (flows/pipeline.py, and through it retraining and the Python API) and the
benchmark (benchmarks/sweep.py) all call `fit`. Privacy: each mechanism's event is added to
`spend` as soon as it completes, and `spend.in_mechanism` is set while one runs, so that a
caller can settle a failed run truthfully (flows/pipeline.py). With `private=False` the same
steps run without clipping or noise (exact clipped statistics, non-noisy EM, noise-free
SGD, argmax selection): the benchmark's non-private reference, never a release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl
import torch

from privflow.core.config import RunConfig
from privflow.core.steps import StepRunner, plain_call
from privflow.data.chunked import DiskRows
from privflow.data.codec import Codec
from privflow.data.copula import DEFAULT_GRID_BINS, CopulaCodec, Marginals, marginal_of, schema_cells
from privflow.data.lowering import lower
from privflow.data.schema import Schema
from privflow.data.target_head import TargetCodec, calibration_shift
from privflow.models import TabularFlow, build_flow, initial_flow
from privflow.models.base import FlowModel
from privflow.privacy.accounting.accountant import PLDAccountant
from privflow.privacy.accounting.events import Event, PoissonGaussianEvent
from privflow.privacy.accounting.plan import PrivacyPlan
from privflow.privacy.dpsgd.dp_sgd import TrainResult, TrainSettings
from privflow.privacy.mechanisms import dp_mog, dp_stats, report_noisy_max
from privflow.serving.sampler import iter_samples, sample_rows
from privflow.tasks.encode import encode_rows
from privflow.tasks.head_stage import dp_target_head, fit_head, head_rows
from privflow.tasks.marginals_stage import dp_marginal_codec, planned_grid_bins
from privflow.tasks.prior_stage import PRIOR_CLIP, dp_prior
from privflow.tasks.run_plan import head_planned, head_shape, run_plan, sgd_shape
from privflow.tasks.select import loglik_matrix, per_pick_epsilon, select_checkpoints
from privflow.tasks.stats_stage import STATS_CLIP, dp_statistics, preprocessed_statistics
from privflow.tasks.train import settings_for, train_flow_model


@dataclass
class Spend:
    """The events spent so far, in order; `in_mechanism` is set while one runs."""

    events: list[Event] = field(default_factory=list)
    in_mechanism: bool = False

    def start(self) -> None:
        self.in_mechanism = True

    def add(self, event: Event) -> None:
        self.events.append(event)
        self.in_mechanism = False


@dataclass
class FitResult:
    """The trained checkpoints, the chosen ones as eval-mode flows, and what the fit spent."""

    codec: Codec | CopulaCodec | TargetCodec
    train: TrainResult
    settings: TrainSettings
    chosen: list[int]
    flows: list[torch.nn.Module]
    events: list[Event]
    cumulative_epsilon: list[tuple[int, float]]
    mean: np.ndarray
    std: np.ndarray
    copula_only: bool = False
    warm_start: str | None = None  # the parent (config.init_from: public) whose weights training began from

    @property
    def release_note(self) -> str | None:
        """What the user must know about the release when it is not a trained flow (public: a
        function of the plan and of the DP selection's output), else None."""
        if self.copula_only:
            return (
                "No flow was trained: at this epsilon the table is too small for DP-SGD to learn "
                "(train.min_effective_batch), so the DP marginals took the flow's budget and the synthetic "
                "columns are drawn independently from them (the independent copula)"
                + (
                    f", the target '{self.codec.target}' from the DP target head given them."
                    if isinstance(self.codec, TargetCodec)
                    else "."
                )
            )
        if self.fell_back:
            return (
                "Selection chose the flow before DP-SGD: on held-out rows no trained checkpoint beat "
                "independent columns, so the synthetic columns are drawn independently"
                + (" from the DP marginals." if isinstance(self.codec, CopulaCodec) else ".")
            )
        if self.warm_start is not None and self.chosen_steps == [0]:
            return (
                f"Selection chose step 0, the weights of the warm start's parent '{self.warm_start}': on held-out "
                "rows no DP-SGD checkpoint beat them, so the release is the parent's flow through this run's codec."
            )
        return None

    @property
    def states(self) -> list[dict]:
        return [self.train.checkpoints[i][1] for i in self.chosen]

    @property
    def chosen_steps(self) -> list[int]:
        return [self.train.checkpoints[i][0] for i in self.chosen]

    @property
    def fell_back(self) -> bool:
        """Selection chose the flow before DP-SGD (`select.include_start`): training did not beat
        independent columns on held-out rows, so the release is the DP marginals (or DP statistics)
        with independent columns. Public: a function of the DP selection's output. Never for a
        warm start, whose step 0 is its parent's trained flow."""
        return self.chosen_steps == [0] and self.warm_start is None

    def sample(self, n: int, seed: int | None = None, rules: bool = True) -> pl.DataFrame:
        """`n` synthetic rows in equal shares from the chosen flows (post-processing; explicit
        generator), each meeting the schema's rules (`rules=False`: drawn without them)."""
        return sample_rows(self.flows, self.codec, n, seed=seed, rules=rules)

    def diagnostics(self) -> dict[str, Any]:
        """Facts computed on private rows WITHOUT a mechanism: curator-only."""
        return {
            "train_losses": self.train.losses,
            "nonfinite_examples": getattr(self.train, "nonfinite_examples", None),
            "dp_stats": {"mean": np.asarray(self.mean).tolist(), "std": np.asarray(self.std).tolist()},
        }


def model_factory(
    config: RunConfig, codec: Codec | CopulaCodec | TargetCodec
) -> Callable[[dict | None], torch.nn.Module]:
    """Build the configured flow; with a state dict, load it and switch to eval mode."""
    kwargs = config.model.model_dump(exclude={"name"})

    def make(state: dict | None = None) -> torch.nn.Module:
        m = build_flow(config.model.name, codec.cardinalities, **kwargs)
        if state is None:
            return m
        m.load_state_dict(state)
        return m.eval()

    return make


def initial_model(
    config: RunConfig, codec: Codec | CopulaCodec | TargetCodec, state: dict | None = None
) -> TabularFlow:
    """The untrained flow, its weights drawn from the config's public seed (the global RNG is
    left as it was); with `state`, a warm start: the parent's released weights, in train mode."""
    model = initial_flow(config.model, codec.cardinalities, config.train.seed)
    if state is not None:
        model.load_state_dict(state)
    return model


def _actnorm_statistics(model: Any) -> tuple[np.ndarray, np.ndarray]:
    """The (mean, std) a warm-started flow's first actnorm already holds (its parent's)."""
    act = model.first_actnorm()
    return act.loc.detach().cpu().numpy().copy(), torch.exp(act.log_scale).detach().cpu().numpy().copy()


def _preprocessed(model: FlowModel, x: np.ndarray | DiskRows) -> np.ndarray:
    with torch.no_grad():
        return model.preprocess(torch.as_tensor(x, dtype=torch.float32)).numpy().astype(np.float64)


def exact_statistics(model: Any, x: np.ndarray | DiskRows) -> tuple[np.ndarray, np.ndarray]:
    """Non-private only: the same clipped mean/std as the DP statistics, without noise."""
    moments = preprocessed_statistics(model, x)
    mean, std = dp_stats.mean_std_from_statistics(moments, STATS_CLIP)
    model.init_actnorm(torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32))
    return mean, std


def exact_mog_prior(
    model: Any, x: np.ndarray | DiskRows, mean: np.ndarray, std: np.ndarray, k: int, iterations: int, seed: int
) -> Any:
    """Non-private only: the EM of tasks/prior_stage.py without noise, on the same clipped,
    standardised features, carried back to the preprocessed space for ``set_prior``."""
    c = np.clip((_preprocessed(model, x) - mean) / std, -PRIOR_CLIP, PRIOR_CLIP)
    params = dp_mog.init_mog(k, c.shape[1], PRIOR_CLIP, np.random.default_rng(seed))
    for _ in range(iterations):
        params = dp_mog.m_step(
            dp_mog.em_statistics(c, params, PRIOR_CLIP), params, PRIOR_CLIP, 1.0, 5e-2 * PRIOR_CLIP, 1e-2 / k
        )
    weights, means, stds = (
        torch.as_tensor(a, dtype=torch.float32) for a in (params.weights, mean + std * params.means, std * params.stds)
    )
    model.set_prior(weights, means, stds)
    return params


def initialise(
    model: FlowModel,
    config: RunConfig,
    plan: PrivacyPlan | None,
    x_train: np.ndarray | DiskRows,
    spend: Spend,
    runner: StepRunner = plain_call,
) -> tuple[np.ndarray, np.ndarray]:
    """DP statistics (actnorm) and, when planned, the DP prior; exact ones when `plan` is None.
    The DP steps go through `runner` (core/steps.py).

    A warm start (`config.init_from`) keeps the parent's actnorm and prior and spends nothing
    here: its plan has no such stages (tasks/run_plan.py, `without_initialisation`).
    """
    if config.init_from is not None:
        return _actnorm_statistics(model)
    if plan is None:
        mean, std = exact_statistics(model, x_train)
        if config.model.prior == "mog":
            exact_mog_prior(
                model, x_train, mean, std, config.model.mog_components, config.model.mog_iterations, config.train.seed
            )
        return mean, std
    spend.start()
    mean, std = runner(dp_statistics, model, x_train, plan.stage("dp_stats"))
    spend.add(plan.stage("dp_stats").event)
    if plan.has("dp_prior"):
        spend.start()
        runner(dp_prior, model, x_train, mean, std, plan.stage("dp_prior"), config.model.mog_components)
        spend.add(plan.stage("dp_prior").event)
    return mean, std


def exact_marginal_codec(schema: Schema, df: pl.DataFrame, grid_bins: int | str = DEFAULT_GRID_BINS) -> CopulaCodec:
    """Non-private only (the benchmark's reference): the copula codec of the rows' own marginals,
    on the grid a private run uses."""
    grid_bins = planned_grid_bins(grid_bins, schema.dataset.expected_rows)  # type: ignore[arg-type]
    cells = schema_cells(schema, grid_bins=grid_bins)
    return CopulaCodec.from_marginals(
        schema, Marginals({c.column: marginal_of(df, c) for c in cells}, grid_bins=grid_bins)
    )


def prepare(
    config: RunConfig,
    schema: Schema,
    df: pl.DataFrame,
    plan: PrivacyPlan | None,
    spend: Spend,
    runner: StepRunner = plain_call,
) -> tuple[Codec | CopulaCodec | TargetCodec, np.ndarray, np.ndarray]:
    """The codec rows are trained in, and the encoded training / selection rows.

    With marginals enabled, the planned DP marginals stage runs first (its event goes to
    `spend`) and rows are encoded through the DP CDFs; otherwise the schema-only codec. With a
    target head planned, the head is trained next (its event goes to `spend`) and the codec is
    a `TargetCodec`: the flow's rows are every column but the target. `plan=None` is the
    non-private reference (exact marginals, a head without noise). `df` is validated (its
    columns the modelled schema's, `privflow.data.lowering.lower`), and so is what is built.
    Each step goes through `runner` (core/steps.py; a Prefect task run inside a flow).
    """
    schema = lower(schema)
    codec: Codec | CopulaCodec | TargetCodec = Codec.from_schema(schema)
    if plan is not None and plan.has("dp_marginals"):
        spend.start()
        codec = runner(dp_marginal_codec, df, schema, plan.stage("dp_marginals"), config.marginals.grid_bins)
        spend.add(plan.stage("dp_marginals").event)
    elif plan is None and config.marginals.enabled:
        codec = exact_marginal_codec(schema, df, config.marginals.grid_bins)
    ranks = codec if isinstance(codec, CopulaCodec) and config.head.ranked else None
    if plan is not None and plan.has("dp_head"):
        spend.start()
        head = runner(dp_target_head, df, schema, config.head, plan.stage("dp_head"), ranks)
        spend.add(plan.stage("dp_head").event)
        codec = TargetCodec.around(schema, codec, head)
    elif plan is None and head_planned(config, schema):
        rows = head_rows(schema, df, config.head.numeric_knots, ranks)
        head = fit_head(rows, schema, config.head, head_shape(config, schema), None, ranks is not None)
        codec = TargetCodec.around(schema, codec, head)
    fraction = config.select.fraction(schema.dataset.expected_rows)
    x_train, x_val = runner(encode_rows, df, codec, fraction, config.train.seed)
    return codec, x_train, x_val


def nonprivate_settings(config: RunConfig, schema: Schema) -> TrainSettings:
    """The planned shape (sample rate, steps) with no clipping and no noise."""
    return settings_for(config.train, None, sgd_shape(config, schema))


def cumulative_epsilon(
    before: list[Event], sgd: PoissonGaussianEvent, steps: list[int], delta: float
) -> list[tuple[int, float]]:
    """The accountant's epsilon after each checkpoint step (`before`: the events spent earlier)."""
    pld = PLDAccountant()
    return [
        (t, pld.epsilon([*before, PoissonGaussianEvent(sgd.sample_rate, sgd.noise_multiplier, t)], delta))
        for t in steps
    ]


def _argmax_checkpoint(
    make: Callable[[dict], torch.nn.Module], result: TrainResult, x_val: np.ndarray | DiskRows, config: RunConfig
) -> list[int]:
    """Non-private selection: the best clipped validation log-likelihood sum."""
    lo, hi = config.select.score_low, config.select.score_high
    ll = loglik_matrix(make, [s for _, s in result.checkpoints], x_val)
    ll = np.clip(np.nan_to_num(ll, nan=lo, neginf=lo, posinf=hi), lo, hi)
    return [int(np.argmax(ll.sum(axis=1)))]


CALIBRATION_ROWS = 20_000  # public: the released flows' own draws that calibrate the head


def calibrated(codec: Codec | CopulaCodec | TargetCodec, flows: list[torch.nn.Module], seed: int) -> Any:
    """The target head's class rates made equal to the DP marginal's over the released flows'
    own samples (`privflow.data.target_head.calibration_shift`). Post-processing: it reads the
    released flows, the released rates and draws from the public `seed`, no row. Codecs
    without a head, or without DP marginals to calibrate to, come back unchanged."""
    if not isinstance(codec, TargetCodec) or codec.rates is None:
        return codec
    frames = iter_samples(flows, codec.inner, CALIBRATION_ROWS, seed=seed)
    log_probs = np.concatenate([codec.sampling_log_probs(f) for f in frames])
    return codec.with_head(codec.head.shifted(calibration_shift(log_probs, codec.rates)))


def copula_only(
    config: RunConfig,
    schema: Schema,
    codec: Codec | CopulaCodec | TargetCodec,
    make: Callable[[dict | None], torch.nn.Module],
    spend: Spend,
) -> FitResult:
    """The small-data release (`tasks.run_plan.copula_only_plan`): no flow is trained; the
    released flow is the untrained one at its public initial weights, whose samples
    `CopulaCodec.uniformize` turns into exactly independent uniform columns, decoded through the
    DP marginals. Reads no row."""
    model = initial_model(config, codec)
    start = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    d = len(codec.cardinalities)
    shape = sgd_shape(config, schema)
    settings = replace(settings_for(config.train, None, shape), steps=0)  # nothing trained
    result = TrainResult(checkpoints=[(0, start)], steps=0)
    flows = [make(start)]
    return FitResult(
        calibrated(codec, flows, config.train.seed),
        result,
        settings,
        [0],
        flows,
        list(spend.events),
        [],
        np.zeros(d),
        np.ones(d),
        copula_only=True,
    )


def fit(
    config: RunConfig,
    schema: Schema,
    codec: Codec | CopulaCodec | TargetCodec,
    x_train: np.ndarray | DiskRows,
    x_val: np.ndarray | DiskRows,
    *,
    plan: PrivacyPlan | None = None,
    private: bool = True,
    spend: Spend | None = None,
    show_progress: bool = False,
    runner: StepRunner = plain_call,
    init_state: dict | None = None,
) -> FitResult:
    """Train the configured flow on encoded rows and choose its checkpoint(s).

    `plan` defaults to the configuration's plan (tasks/run_plan.py); the train flow passes
    the plan its ledger reserved. Each step goes through `runner` (core/steps.py; a Prefect task
    run inside a flow, flows/steps.py).
    `init_state`: a warm start's parent weights (tasks/warm_start.py); it comes with
    `config.init_from`, which is what shapes the plan, so the two must be given together.
    """
    if (init_state is None) != (config.init_from is None):
        raise ValueError("a warm start needs both config.init_from (it shapes the plan) and init_state (the weights)")
    spend = spend if spend is not None else Spend()
    plan = (plan or run_plan(config, schema)) if private else None
    make = model_factory(config, codec)
    if plan is not None and not plan.has("train"):
        return copula_only(config, schema, codec, make, spend)
    model = initial_model(config, codec, init_state)
    mean, std = initialise(model, config, plan, x_train, spend, runner)
    if plan is not None:  # the trainer keeps only the states selection will score (dp_sgd.checkpoint_steps)
        keep = config.select.max_candidates
        settings = replace(settings_for(config.train, plan.stage("train")), max_checkpoints=keep)
    else:
        settings = nonprivate_settings(config, schema)
    start = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    spend.start()
    result = runner(train_flow_model, model, x_train, settings, show_progress)
    points: list[tuple[int, float]] = []
    if plan is None:
        spend.in_mechanism = False
        chosen = _argmax_checkpoint(make, result, x_val, config)
    else:
        assert result.event is not None
        # the epsilon curve at the candidates only: one PLD composition per point, too slow to
        # repeat at every checkpoint of a long run (benchmarks/results/scaling.md)
        points = cumulative_epsilon(spend.events, result.event, [s for s, _ in result.checkpoints], plan.delta)
        spend.add(result.event)
        if config.select.include_start:
            result.checkpoints.insert(0, (0, start))
        stage = plan.stage("select")
        spend.start()
        chosen = runner(select_checkpoints, make, result.checkpoints, x_val, stage, config.select)
        spend.add(report_noisy_max.rnm_event(per_pick_epsilon(stage), len(chosen)))
    flows = [make(result.checkpoints[i][1]) for i in chosen]
    codec = calibrated(codec, flows, config.train.seed)
    return FitResult(
        codec, result, settings, chosen, flows, list(spend.events), points, mean, std, warm_start=config.init_from
    )


__all__ = [
    "FitResult",
    "Spend",
    "copula_only",
    "cumulative_epsilon",
    "exact_mog_prior",
    "exact_statistics",
    "fit",
    "initial_model",
    "initialise",
    "model_factory",
    "nonprivate_settings",
    "prepare",
]
