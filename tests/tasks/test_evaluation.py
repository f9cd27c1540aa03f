"""Tests of the evaluation diagnostics (tasks/evaluation), against hand-computed values and
independent references (brute-force Kendall tau-b, scipy's Cramer's V, cdist, Mann-Whitney)."""

from __future__ import annotations

import base64
import itertools
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy.spatial.distance import cdist
from scipy.stats.contingency import association

from privflow.core.config import EvaluateConfig
from privflow.core.errors import DataError
from privflow.data.features import feature_matrix
from privflow.data.schema import Schema
from privflow.tasks.evaluation import BANNER, evaluate
from privflow.tasks.evaluation.fidelity import (
    cramers_matrix,
    cramers_v,
    fidelity,
    kendall_matrix,
    marginal_tv,
    upper_triangle_errors,
)
from privflow.tasks.evaluation.risk import dcr, likelihood_mia, nearest_distances, tpr_at_fpr
from privflow.tasks.evaluation.utility import CLASSIFIERS, UtilityResult, classify, utility

DEMO = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"


def _load(schema: Schema, path: Path, n: int | None = None) -> pl.DataFrame:
    types = {
        c.name: pl.String if c.is_categorical else pl.Int64 if c.type == "integer" else pl.Float64
        for c in schema.columns
    }
    return pl.read_csv(path, schema_overrides=types, n_rows=n).select(schema.names)


@pytest.fixture(scope="module")
def adult() -> tuple[Schema, pl.DataFrame, pl.DataFrame]:
    schema = Schema.from_yaml(DEMO / "adult.yaml")
    return schema, _load(schema, DEMO / "adult_train.csv", 3000), _load(schema, DEMO / "adult_test.csv", 1500)


@pytest.fixture(scope="module")
def small() -> Schema:
    return Schema.model_validate(
        {
            "dataset": {"name": "toy"},
            "target": "c",
            "columns": [
                {"name": "x", "type": "numeric", "bounds": [0, 10], "nullable": True},
                {"name": "y", "type": "numeric", "bounds": [0, 1000], "transform": "log1p"},
                {"name": "c", "type": "categorical", "categories": ["a", "b", "c", "d"]},
                {"name": "k", "type": "categorical", "categories": ["u", "v"], "nullable": True},
            ],
        }
    )


# ---------------------------------------------------------------- fidelity


def test_tv_of_table_with_itself_is_zero(adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    schema, train, _ = adult
    tv = marginal_tv(schema, train, train)
    assert set(tv) == set(schema.names)
    assert all(v == 0.0 for v in tv.values())


def test_tv_of_disjoint_supports_is_one(small: Schema) -> None:
    real = pl.DataFrame({"x": [0.0, 1.0, 4.0], "y": [0.0, 1.0, 2.0], "c": ["a", "b", "a"], "k": ["u", "u", "u"]})
    syn = pl.DataFrame(
        {"x": [6.0, 9.0, 10.0], "y": [500.0, 900.0, 1000.0], "c": ["c", "d", "d"], "k": ["v", None, "v"]}
    )
    tv = marginal_tv(small, real, syn)
    assert tv == pytest.approx({"x": 1.0, "y": 1.0, "c": 1.0, "k": 1.0}, abs=1e-12)


def test_tv_hand_values_public_bins_and_missing(small: Schema) -> None:
    # bins of x are [0, .5), [.5, 1), ...: 0.1 and 0.4 share a bin, 0.6 does not
    a = pl.DataFrame({"x": [0.1, 0.1, None, 3.0], "y": [0.0] * 4, "c": ["a", "a", "b", "b"], "k": ["u"] * 4})
    b = pl.DataFrame({"x": [0.4, 0.6, 3.2, 3.3], "y": [0.0] * 4, "c": ["a", "b", "b", "b"], "k": ["u"] * 4})
    tv = marginal_tv(small, a, b)
    # x: a = {bin0: .5, missing: .25, bin6: .25}, b = {bin0: .25, bin1: .25, bin6: .5}
    assert tv["x"] == pytest.approx(0.5 * (0.25 + 0.25 + 0.25 + 0.25))
    assert tv["c"] == pytest.approx(0.25)
    # log1p bins of width log(1001)/20 = 0.345: log1p(20) = 3.04 and log1p(21) = 3.09 share bin 8,
    # 0 and 0.3 share bin 0, log1p(5) = 1.79 is in bin 5 (on a linear scale all would share bin 0)
    c = a.with_columns(y=pl.Series([20.0, 20.0, 0.0, 0.0]))
    d = a.with_columns(y=pl.Series([21.0, 21.0, 0.3, 5.0]))
    assert marginal_tv(small, c, d)["y"] == pytest.approx(0.25)


def test_enum_categoricals_match_strings(adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    schema, train, test = adult
    enum = train.with_columns(
        pl.col(c.name).cast(pl.Enum(list(c.categories))) for c in schema.columns if c.is_categorical and c.categories
    )
    assert marginal_tv(schema, enum, test) == marginal_tv(schema, train, test)


def _tau_b_bruteforce(x: np.ndarray, y: np.ndarray) -> float:
    conc = disc = tx = ty = 0
    for i, j in itertools.combinations(range(x.size), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            tx += 1
        elif dy == 0:
            ty += 1
        elif dx == dy:
            conc += 1
        else:
            disc += 1
    return (conc - disc) / np.sqrt((conc + disc + tx) * (conc + disc + ty))


def test_kendall_matrix_matches_bruteforce_and_identical_rmse_is_zero(
    adult: tuple[Schema, pl.DataFrame, pl.DataFrame],
) -> None:
    schema, train, _ = adult
    sub = train.head(150)
    tau = kendall_matrix(schema, sub)
    names = [c.name for c in schema.columns if not c.is_categorical]
    i, j = names.index("age"), names.index("hours-per-week")
    ref = _tau_b_bruteforce(sub["age"].to_numpy().astype(float), sub["hours-per-week"].to_numpy().astype(float))
    assert tau[i, j] == pytest.approx(ref, abs=1e-12)
    assert np.allclose(tau, tau.T)
    res = fidelity(schema, train, train)
    m = res.metrics()
    assert m["fidelity/kendall_rmse"] == 0.0 and m["fidelity/kendall_mae"] == 0.0
    assert m["fidelity/cramers_v_mae"] == 0.0 and m["fidelity/tv_mean"] == 0.0


def test_upper_triangle_errors_hand_values() -> None:
    a = np.array([[1.0, 0.5, 0.2], [0.5, 1.0, -0.1], [0.2, -0.1, 1.0]])
    b = np.array([[1.0, 0.1, 0.2], [0.1, 1.0, 0.2], [0.2, 0.2, 1.0]])
    rmse, mae = upper_triangle_errors(a, b)  # differences 0.4, 0.0, -0.3
    assert rmse == pytest.approx(np.sqrt((0.16 + 0.09) / 3))
    assert mae == pytest.approx(0.7 / 3)


def test_constant_synthetic_column_gets_zero_tau(small: Schema) -> None:
    df = pl.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "y": [5.0] * 4, "c": ["a"] * 4, "k": ["u"] * 4})
    tau = kendall_matrix(small, df)
    assert tau[0, 1] == 0.0 and tau[1, 1] == 1.0


def test_cramers_v_matches_scipy(adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    schema, train, _ = adult
    a = train["sex"].to_numpy()
    b = train["relationship"].to_numpy()
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1), dtype=np.int64)
    np.add.at(table, (ai, bi), 1)
    assert cramers_v(ai, bi) == pytest.approx(association(table, method="cramer", correction=False), abs=1e-12)
    v = cramers_matrix(schema, train)
    assert np.allclose(v, v.T) and np.all((v >= 0) & (v <= 1))
    assert cramers_v(np.zeros(10, int), np.arange(10)) == 0.0


# ---------------------------------------------------------------- utility


def test_utility_real_reference_is_sensible(adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    schema, train, test = adult
    res = utility(schema, train.head(1500), train.head(1500), test, repeats=1)
    m = res.metrics()
    assert 0.75 < m["utility/real_auroc_mean"] <= 1.0
    assert m["utility/auroc_mean"] == m["utility/real_auroc_mean"]  # same table, same seeds
    table = res.table()
    assert table.height == 2 * len(CLASSIFIERS)
    assert table.filter(pl.col("train_on") == "synthetic")["classifier"].to_list() == list(CLASSIFIERS)


def test_single_class_synthetic_gives_constant_predictor_scores(
    adult: tuple[Schema, pl.DataFrame, pl.DataFrame],
) -> None:
    schema, train, test = adult
    syn = train.head(200).with_columns(income=pl.lit("<=50K"))
    recs = classify(schema, syn, test)
    y = (test["income"] == ">50K").to_numpy()
    n, n0 = y.size, int((~y).sum())
    # always answering '<=50K': F1(neg) = 2 n0 / (n0 + n), F1(pos) = 0
    assert len(recs) == len(CLASSIFIERS)
    for r in recs:
        assert r["auroc"] == 0.5
        assert r["ap"] == pytest.approx(y.mean())
        assert r["macro_f1"] == pytest.approx(n0 / (n0 + n))


def test_repeats_subsample_and_aggregate(adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    schema, train, test = adult
    names = ("LogisticRegression", "DecisionTree")
    recs = classify(schema, train.head(600), test.head(400), repeats=3, max_train_rows=300, classifiers=names)
    assert [(r["classifier"], r["repeat"]) for r in recs] == [(n, k) for k in range(3) for n in names]
    tree = [r["auroc"] for r in recs if r["classifier"] == "DecisionTree"]
    assert len(set(tree)) > 1  # a fresh 300-row subsample per repeat
    res = UtilityResult(synthetic=recs, real=None)
    m = res.metrics()
    assert m["utility/auroc_mean"] == pytest.approx(np.mean([r["auroc"] for r in recs]))
    assert m["utility/auroc_std"] == pytest.approx(np.std([r["auroc"] for r in recs]))
    assert "utility/real_auroc_mean" not in m
    table = res.table()
    assert table["classifier"].to_list() == list(names)
    assert table.filter(pl.col("classifier") == "DecisionTree")["auroc_std"][0] == pytest.approx(np.std(tree))


def test_utility_needs_a_target(small: Schema, adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    schema, train, test = adult
    no_target = schema.model_copy(update={"target": None})
    with pytest.raises(DataError, match="target"):
        classify(no_target, train, test)


# ---------------------------------------------------------------- risk


def test_mia_auroc_identical_and_separated() -> None:
    rng = np.random.default_rng(0)
    same = likelihood_mia(rng.normal(size=5000), rng.normal(size=5000))
    assert abs(same.auroc - 0.5) < 0.03
    assert same.tpr_at_1pct_fpr < 0.04
    apart = likelihood_mia(rng.normal(10, 1, 2000), rng.normal(0, 1, 2000))
    assert apart.auroc > 0.999 and apart.tpr_at_1pct_fpr > 0.99


def test_mia_auroc_is_mann_whitney_and_tpr_hand_value() -> None:
    a = np.array([3.0, 1.0, 2.5, -np.inf])
    b = np.array([0.0, 2.0, 2.0, np.nan])
    res = likelihood_mia(a, b)
    a2, b2 = np.array([3.0, 1.0, 2.5, -1e300]), np.array([0.0, 2.0, 2.0, -1e300])
    pairs = [(x > y) + 0.5 * (x == y) for x in a2 for y in b2]
    assert res.auroc == pytest.approx(np.mean(pairs))
    y = np.array([1, 1, 0, 0, 0])
    s = np.array([0.9, 0.4, 0.5, 0.1, 0.2])  # threshold 0.9 -> TPR .5 at FPR 0; next costs FPR 1/3
    assert tpr_at_fpr(y, s, 0.01) == 0.5
    assert tpr_at_fpr(y, s, 0.34) == 1.0


def test_nearest_distances_matches_cdist() -> None:
    rng = np.random.default_rng(1)
    q, r = rng.random((300, 7)), rng.random((500, 7))
    assert np.allclose(nearest_distances(q, r, chunk=64), cdist(q, r).min(axis=1), atol=1e-12)
    assert np.all(nearest_distances(r[:20], r) == 0.0)


def test_dcr_shares(small: Schema) -> None:
    rng = np.random.default_rng(2)

    def draw(n: int) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "x": rng.uniform(0, 10, n),
                "y": rng.uniform(0, 1000, n),
                "c": rng.choice(list("abcd"), n),
                "k": rng.choice(["u", "v"], n),
            }
        )

    train, holdout = draw(400), draw(400)
    copied = dcr(small, train, train, holdout).metrics()
    assert copied["risk/dcr_share_closer_to_train"] == 1.0
    assert copied["risk/exact_match_train"] == 1.0 and copied["risk/dcr_train_median"] == 0.0
    assert copied["risk/exact_match_holdout"] == 0.0
    fresh = dcr(small, draw(2000), train, holdout).metrics()
    assert abs(fresh["risk/dcr_share_closer_to_train"] - 0.5) < 0.05
    # equal-size reference samples: a larger train table must not bias the share
    bigger = dcr(small, draw(2000), draw(4000), holdout).metrics()
    assert abs(bigger["risk/dcr_share_closer_to_train"] - 0.5) < 0.05


def test_feature_matrix_uses_public_bounds_only(small: Schema) -> None:
    df = pl.DataFrame({"x": [5.0, None, 20.0], "y": [0.0, 1000.0, 99.0], "c": ["b", "a", "zz"], "k": [None, "v", "u"]})
    x, names = feature_matrix(small, df)
    assert names == ["x", "x__missing", "y", "c=a", "c=b", "c=c", "c=d", "k=u", "k=v", "k=(missing)"]
    assert np.allclose(x[:, 0], [0.5, 0.0, 1.0]) and np.allclose(x[:, 1], [0, 1, 0])
    assert np.allclose(x[:, 2], [0.0, 1.0, np.log1p(99) / np.log1p(1000)])
    assert np.allclose(x[:, 3:7], [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # undeclared label: all zero
    assert np.allclose(x[:, 7:], [[0, 0, 1], [0, 1, 0], [1, 0, 0]])


# ---------------------------------------------------------------- report


def _logliks(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"train": rng.normal(-20, 3, 800) + 0.5, "holdout": rng.normal(-20, 3, 300), "test": rng.normal(-20, 3, 500)}


def test_evaluate_writes_self_contained_report(
    tmp_path: Path, adult: tuple[Schema, pl.DataFrame, pl.DataFrame]
) -> None:
    schema, train, test = adult
    train, test = train.head(1500), test.head(800)
    syn = train.sample(n=1500, with_replacement=True, seed=3)
    res = evaluate(schema, train, test, syn, EvaluateConfig(), tmp_path, loglik=_logliks(np.random.default_rng(0)))
    assert res.html_path is not None and res.html_path.is_file()
    page = res.html_path.read_text(encoding="utf-8")
    assert BANNER in page and page.index(BANNER) < page.index("<h1>")
    assert set(res.figures) == {"marginals", "kendall", "cramers_v", "projection", "dcr", "loglik"}
    for path in res.figures.values():
        assert base64.b64encode(path.read_bytes()).decode("ascii") in page
    assert 'src="http' not in page and "<script" not in page  # self-contained, static
    for key in (
        "utility/macro_f1_mean",
        "utility/real_auroc_mean",
        "fidelity/tv_mean",
        "fidelity/kendall_rmse",
        "risk/mia_auroc",
        "risk/dcr_share_closer_to_train",
        "likelihood/heldout_nats_per_row",
    ):
        assert np.isfinite(res.metrics[key]), key
    assert res.metrics["likelihood/heldout_nats_per_row"] == pytest.approx(
        np.mean(_logliks(np.random.default_rng(0))["test"])
    )
    assert res.classifiers is not None and res.classifiers.height == 18
    assert res.notes == ()


def test_evaluate_switches_and_skips(tmp_path: Path, adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    schema, train, test = adult
    cfg = EvaluateConfig(utility=False, likelihood=False, privacy_risk=False, report=False)
    res = evaluate(schema, train.head(500), test.head(300), train.tail(500), cfg, tmp_path)
    assert res.metrics and all(k.startswith("fidelity/") for k in res.metrics)
    assert res.html_path is None and res.figures == {} and res.classifiers is None


def test_evaluate_skips_absent_inputs_with_notes(
    tmp_path: Path, adult: tuple[Schema, pl.DataFrame, pl.DataFrame]
) -> None:
    schema, train, _ = adult
    cfg = EvaluateConfig(fidelity=False, utility=True, likelihood=True, privacy_risk=True, report=True)
    res = evaluate(schema, train.head(300), None, train.tail(300), cfg, tmp_path)
    assert res.metrics == {} and len(res.notes) == 4
    # no test table given: the notes say so (and name the option), never that it is empty
    assert any("no real test table was given (--test-data)" in n for n in res.notes), res.notes
    assert not any("empty" in n for n in res.notes), res.notes
    # a given but empty test table is treated as absent, and the notes say it was empty
    res = evaluate(schema, train.head(300), train.head(0), train.tail(300), cfg, tmp_path)
    assert res.metrics == {} and len(res.notes) == 5 and "empty" in res.notes[0]
    assert not any("was given" in n for n in res.notes), res.notes
    assert res.html_path is not None and BANNER in res.html_path.read_text(encoding="utf-8")
    assert set(res.figures) == {"marginals", "projection"}


def test_evaluate_rejects_missing_columns(tmp_path: Path, adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    schema, train, test = adult
    with pytest.raises(DataError, match="synthetic"):
        evaluate(schema, train, test, train.drop("age"), EvaluateConfig(), tmp_path)


def _four_classes(n: int, seed: int) -> pl.DataFrame:
    """Rows of `small` whose class c follows x (with noise), every class present."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 10, n)
    c = np.clip((x / 2.5 + rng.normal(0, 0.6, n)).astype(int), 0, 3)
    return pl.DataFrame(
        {
            "x": x,
            "y": rng.uniform(0, 1000, n),
            "c": np.array(["a", "b", "c", "d"])[c],
            "k": rng.choice(["u", "v"], n),
        }
    )


def test_a_target_of_more_classes_reports_one_vs_rest_macro_averages_as_sklearn(small: Schema) -> None:
    """No silent last category: a 4-class target without target_positive is scored one-vs-rest,
    and the figures are scikit-learn's own multi-class macro averages."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import average_precision_score, f1_score, roc_auc_score
    from sklearn.preprocessing import label_binarize

    from privflow.tasks.evaluation.utility import labelled, scoring

    train, test = _four_classes(600, 1), _four_classes(400, 2)
    how = scoring(small)
    assert not how.binary and "one-vs-rest macro averages over its 4 classes" in how.describe()
    (rec,) = classify(small, train, test, classifiers=("LogisticRegression",))
    x, y = labelled(small, train)
    xt, yt = labelled(small, test)
    assert set(yt.tolist()) == {0, 1, 2, 3}
    clf = LogisticRegression(max_iter=300).fit(x, y)
    proba, pred = clf.predict_proba(xt), clf.predict(xt)
    assert rec["macro_f1"] == pytest.approx(f1_score(yt, pred, average="macro"))
    assert rec["auroc"] == pytest.approx(roc_auc_score(yt, proba, multi_class="ovr", average="macro"))
    assert rec["ap"] == pytest.approx(average_precision_score(label_binarize(yt, classes=[0, 1, 2, 3]), proba))
    # the last class against the rest (the old silent scoring) is a different figure
    assert rec["auroc"] != pytest.approx(roc_auc_score(yt == 3, proba[:, 3]))


def test_target_positive_names_the_class_scored_positive(adult: tuple[Schema, pl.DataFrame, pl.DataFrame]) -> None:
    from privflow.tasks.evaluation.utility import scoring

    schema, train, test = adult
    assert scoring(schema).positive == ">50K" and "its last declared class" in scoring(schema).describe()
    named = schema.model_copy(update={"target_positive": "<=50K"})
    assert scoring(named).positive == "<=50K" and "target_positive" in scoring(named).describe()
    syn = train.head(200).with_columns(income=pl.lit(">50K"))
    y = (test["income"] == "<=50K").to_numpy()
    for r in classify(named, syn, test, classifiers=("GaussianNB",)):
        assert r["auroc"] == 0.5 and r["ap"] == pytest.approx(y.mean())  # constant predictor, positive '<=50K'


def test_the_report_names_the_positive_class_or_says_one_vs_rest(
    small: Schema, adult: tuple[Schema, pl.DataFrame, pl.DataFrame]
) -> None:
    from privflow.tasks.evaluation.html import _utility_section

    recs = [{"classifier": "LogisticRegression", "repeat": 0, "macro_f1": 0.5, "auroc": 0.6, "ap": 0.4}]
    res = UtilityResult(synthetic=recs, real=recs)
    binary = " ".join(_utility_section(adult[0], res.metrics(), res.table()))
    assert "positive class &#x27;&gt;50K&#x27; (its last declared class" in binary and "one-vs-rest" not in binary
    multi = " ".join(_utility_section(small, res.metrics(), res.table()))
    assert "one-vs-rest macro averages" in multi and "macro AUROC (one-vs-rest)" in multi
