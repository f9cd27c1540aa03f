"""Machine-learning utility of synthetic data: train on synthetic, test on real (DP-HFlow,
Experimental Results, "Classification Performance"; Tables 2 and 3).

Nine scikit-learn classifiers are trained on the synthetic table and scored on the real test
table for the schema's target: macro-F1, AUROC and average precision (APC), averaged over
classifiers and repeats. Which class is "positive" is never left implicit (`scoring`): the
schema's `target_positive` when set (that class against the rest); else a target of two classes
scores its last declared one (named in the report), and a target of more classes reports
one-vs-rest macro averages (macro-F1, macro AUROC, macro AP over its classes). The same classifiers
trained on the real training table give the reference. Features are the schema-only encoding
(numerics scaled by PUBLIC bounds, categoricals one-hot over the PUBLIC list): no scaler or
vocabulary is fitted on any table. Not differentially private: for the curator only, never released.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from sklearn.ensemble import (
    AdaBoostClassifier,
    BaggingClassifier,
    HistGradientBoostingClassifier,
    RandomForestClassifier,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, f1_score, roc_auc_score
from sklearn.naive_bayes import BernoulliNB, GaussianNB
from sklearn.neural_network import MLPClassifier
from sklearn.tree import DecisionTreeClassifier
from threadpoolctl import threadpool_limits

from privflow.core import timing
from privflow.core.errors import DataError
from privflow.data.features import category_codes, check_columns, feature_matrix
from privflow.data.schema import Schema
from privflow.tasks.evaluation import worker as diagnostics_worker

CLASSIFIERS: tuple[str, ...] = (
    "LogisticRegression",
    "DecisionTree",
    "RandomForest",
    "HistGradientBoosting",
    "Bagging",
    "MLP",
    "GaussianNB",
    "BernoulliNB",
    "AdaBoost",
)
METRICS: tuple[str, ...] = ("macro_f1", "auroc", "ap")
# The classifiers a diagnostics worker trains while this process trains the others
# (tasks/evaluation/worker.py): about half of the nine's time on Adult each way.
WORKER_SHARE: tuple[str, ...] = ("HistGradientBoosting", "AdaBoost", "RandomForest", "DecisionTree", "BernoulliNB")


def make_classifier(name: str, seed: int) -> Any:
    """One of the nine DP-HFlow classifiers, sized so all nine fit Adult in well under a minute."""
    if name == "LogisticRegression":
        return LogisticRegression(max_iter=300)
    if name == "DecisionTree":
        return DecisionTreeClassifier(min_samples_leaf=5, random_state=seed)
    if name == "RandomForest":
        return RandomForestClassifier(n_estimators=50, min_samples_leaf=2, n_jobs=1, random_state=seed)
    if name == "HistGradientBoosting":
        return HistGradientBoostingClassifier(max_iter=100, early_stopping=False, random_state=seed)
    if name == "Bagging":
        return BaggingClassifier(n_estimators=10, n_jobs=1, random_state=seed)
    if name == "MLP":
        return MLPClassifier(hidden_layer_sizes=(64,), max_iter=30, batch_size=256, random_state=seed)
    if name == "GaussianNB":
        return GaussianNB()
    if name == "BernoulliNB":
        # features lie in [0, 1] by the public scaling; threshold at the middle of the range
        return BernoulliNB(binarize=0.5)
    if name == "AdaBoost":
        return AdaBoostClassifier(n_estimators=50, random_state=seed)
    raise ValueError(f"unknown classifier '{name}'; choose from {CLASSIFIERS}")


@dataclass(frozen=True)
class Scoring:
    """How a target is scored: `positive` names the class scored against the rest (binary
    figures), or None for one-vs-rest macro averages over all `classes`."""

    target: str
    classes: tuple[str, ...]
    positive: str | None
    declared: bool  # positive named by the schema's target_positive

    @property
    def binary(self) -> bool:
        return self.positive is not None

    def describe(self) -> str:
        """A line for the report: which class is positive, or that the figures are macro averages."""
        if self.positive is None:
            return (
                f"one-vs-rest macro averages over its {len(self.classes)} classes (macro-F1, macro AUROC, macro AP; "
                "set `target_positive` in the schema to score one class against the rest)"
            )
        if self.declared:
            return f"positive class '{self.positive}' (the schema's target_positive) against the rest"
        return (
            f"positive class '{self.positive}' (its last declared class; set `target_positive` in the schema to choose)"
        )


def scoring(schema: Schema) -> Scoring:
    """The schema's target scoring (module docstring); DataError without a target."""
    if schema.target is None:
        raise DataError("The schema names no 'target' column, so classification utility cannot be measured.")
    col = schema.column(schema.target)
    classes = tuple(col.true_false if col.type == "boolean" else col.categories or ())
    if schema.target_positive is not None:
        return Scoring(schema.target, classes, schema.target_positive, True)
    if len(classes) <= 2:
        return Scoring(schema.target, classes, classes[-1], False)
    return Scoring(schema.target, classes, None, False)


def labelled(schema: Schema, df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(features, y) for rows with a declared target label: y = 1 for the positive class and 0 for
    the rest where `scoring(schema)` is binary, else y = the class's index among the declared ones."""
    how = scoring(schema)
    col = schema.column(how.target)
    assert col.categories is not None
    codes = category_codes(col, df)
    keep = codes < len(col.categories)
    x, _ = feature_matrix(schema, df.filter(pl.Series(keep)), exclude=(how.target,))
    if how.positive is None:
        return x, codes[keep].astype(np.int64)
    return x, (codes[keep] == list(col.categories).index(how.positive)).astype(np.int64)


def score(y_true: np.ndarray, y_pred: np.ndarray, p_pos: np.ndarray) -> dict[str, float]:
    """Macro-F1 of the hard predictions, AUROC and average precision of the scores: of the
    positive class where `p_pos` is a vector (y in {0, 1}), else (`p_pos` one column per class,
    y the class index) one-vs-rest macro averages over the classes (`ovr_scores`).

    AUROC and AP are undefined (NaN) when the test labels hold a single class.
    """
    if p_pos.ndim == 2:
        return ovr_scores(y_true, y_pred, p_pos)
    f1 = float(f1_score(y_true, y_pred, labels=[0, 1], average="macro", zero_division=0))
    if np.unique(y_true).size < 2:
        return {"macro_f1": f1, "auroc": float("nan"), "ap": float("nan")}
    return {
        "macro_f1": f1,
        "auroc": float(roc_auc_score(y_true, p_pos)),
        "ap": float(average_precision_score(y_true, p_pos)),
    }


def ovr_scores(y_true: np.ndarray, y_pred: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """One-vs-rest macro averages: macro-F1 over the classes in the labels or the predictions (as
    scikit-learn's `f1_score(average='macro')`), and the unweighted mean over the classes present in
    the test labels of each class's AUROC and AP against the rest, from its column of `proba` (as
    `roc_auc_score(multi_class='ovr')` and `average_precision_score(average='macro')` where every
    class is present). NaN AUROC and AP when the test labels hold a single class."""
    f1 = float(f1_score(y_true, y_pred, average="macro", zero_division=0))
    present = np.unique(y_true)
    if present.size < 2:
        return {"macro_f1": f1, "auroc": float("nan"), "ap": float("nan")}
    aurocs = [float(roc_auc_score(y_true == k, proba[:, k])) for k in present]
    aps = [float(average_precision_score(y_true == k, proba[:, k])) for k in present]
    return {"macro_f1": f1, "auroc": float(np.mean(aurocs)), "ap": float(np.mean(aps))}


def constant_scores(y_true: np.ndarray, label: int, classes: int | None = None) -> dict[str, float]:
    """Scores of the predictor that always answers `label` with a constant score (binary; with
    `classes`, the same score for each of that many classes, one-vs-rest).

    AUROC = 0.5 and AP = the positive rate of the test labels (per class), F1 of the constant answer.
    """
    const = np.full(y_true.shape, label, dtype=np.int64)
    if classes is not None:
        return score(y_true, const, np.full((y_true.size, classes), 1.0 / classes))
    return score(y_true, const, np.full(y_true.shape, 0.5))


def classify(
    schema: Schema,
    train: pl.DataFrame,
    test: pl.DataFrame,
    repeats: int = 1,
    seed: int = 0,
    max_train_rows: int = 20_000,
    classifiers: tuple[str, ...] = CLASSIFIERS,
) -> list[dict[str, Any]]:
    """Train each classifier on `train` (at most `max_train_rows` rows, a fresh subsample and
    seed per repeat) and score it on `test`; one record per (classifier, repeat).

    A training table with a single class (or none) yields the constant predictor's scores for
    every classifier instead of an error; an empty training table predicts the first category.
    BLAS/OpenMP run single-threaded here: on a shared worker, multi-threaded OpenMP (histogram
    boosting) and BLAS (MLP) oversubscribe the cores and run several times slower.

    With a diagnostics worker open (tasks/evaluation/worker.py), the records it computed ahead
    for the same arguments (`classify_ahead`) are taken, or it trains `WORKER_SHARE` while this
    process trains the rest; the records are the same either way (same code, seeds and order).
    """
    worker = diagnostics_worker.current()
    if worker is None:
        return classify_here(schema, train, test, repeats, seed, max_train_rows, classifiers)
    args = (schema, train, test, repeats, seed, max_train_rows, classifiers)
    early = worker.take(_key(*args))
    if early is not None:
        ok, records = early.result()
        if ok:
            timing.record("evaluate/utility, real reference (in a worker, during training)", early.seconds or 0.0)
            return records
    there = tuple(c for c in classifiers if c in WORKER_SHARE)
    here = tuple(c for c in classifiers if c not in WORKER_SHARE)
    if not (there and here):
        return classify_here(*args)
    common = args[:-1]  # everything but the classifiers
    job = worker.submit(classify_here, *common, there)
    mine = classify_here(*common, here)
    ok, theirs = job.result()
    if not ok:
        theirs = classify_here(*common, there)
    order = {name: i for i, name in enumerate(classifiers)}
    return sorted([*mine, *theirs], key=lambda r: (r["repeat"], order[r["classifier"]]))


def classify_ahead(
    schema: Schema,
    train: pl.DataFrame,
    test: pl.DataFrame,
    repeats: int = 1,
    seed: int = 0,
    max_train_rows: int = 20_000,
    classifiers: tuple[str, ...] = CLASSIFIERS,
) -> bool:
    """Hand `classify(...)` of these very frames to the open diagnostics worker now, for a later
    `classify` call with the same arguments to take; False when no worker is open."""
    worker = diagnostics_worker.current()
    if worker is None:
        return False
    args = (schema, train, test, repeats, seed, max_train_rows, classifiers)
    worker.submit(classify_here, *args, key=_key(*args))
    return True


def _key(*args: Any) -> tuple[Any, ...]:
    return ("classify", *args)


def classify_here(
    schema: Schema,
    train: pl.DataFrame,
    test: pl.DataFrame,
    repeats: int = 1,
    seed: int = 0,
    max_train_rows: int = 20_000,
    classifiers: tuple[str, ...] = CLASSIFIERS,
) -> list[dict[str, Any]]:
    """`classify` in this process (single-threaded BLAS/OpenMP)."""
    with threadpool_limits(limits=1):
        return _classify(schema, train, test, repeats, seed, max_train_rows, classifiers)


def _classify(
    schema: Schema,
    train: pl.DataFrame,
    test: pl.DataFrame,
    repeats: int,
    seed: int,
    max_train_rows: int,
    classifiers: tuple[str, ...],
) -> list[dict[str, Any]]:
    check_columns(schema, train, "training")
    check_columns(schema, test, "test")
    how = scoring(schema)
    k = None if how.binary else len(how.classes)
    x_all, y_all = labelled(schema, train)
    x_test, y_test = labelled(schema, test)
    if y_test.size == 0:
        raise DataError("The real test table has no row with a declared target label; utility cannot be measured.")
    records: list[dict[str, Any]] = []
    for r in range(repeats):
        rng = np.random.default_rng(seed + r)
        if y_all.size > max_train_rows:
            idx = rng.choice(y_all.size, size=max_train_rows, replace=False)
            x, y = x_all[idx], y_all[idx]
        else:
            x, y = x_all, y_all
        classes = np.unique(y)
        for name in classifiers:
            if classes.size < 2:
                s = constant_scores(y_test, int(classes[0]) if classes.size else 0, k)
            else:
                clf = make_classifier(name, seed + r)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    clf.fit(x, y)
                proba = clf.predict_proba(x_test)
                if k is None:
                    p = proba[:, list(clf.classes_).index(1)]
                else:  # a column per declared class: 0 for a class the training table does not hold
                    p = np.zeros((proba.shape[0], k))
                    p[:, np.asarray(clf.classes_, dtype=np.int64)] = proba
                s = score(y_test, clf.predict(x_test), p)
            records.append({"classifier": name, "repeat": r, **s})
    return records


@dataclass(frozen=True)
class UtilityResult:
    """Per-(classifier, repeat) scores of synthetic-trained and real-trained classifiers."""

    synthetic: list[dict[str, Any]]
    real: list[dict[str, Any]] | None

    def table(self) -> pl.DataFrame:
        """One row per (train_on, classifier): mean and std over repeats of each metric."""
        frames = [pl.DataFrame(self.synthetic).with_columns(train_on=pl.lit("synthetic"))]
        if self.real:
            frames.append(pl.DataFrame(self.real).with_columns(train_on=pl.lit("real")))
        df = pl.concat(frames)
        aggs = []
        for m in METRICS:
            aggs += [pl.col(m).mean().alias(f"{m}_mean"), pl.col(m).std(ddof=0).fill_null(0.0).alias(f"{m}_std")]
        order = {n: i for i, n in enumerate(CLASSIFIERS)}
        return (
            df.group_by("train_on", "classifier", maintain_order=True)
            .agg(aggs)
            .with_columns(_o=pl.col("classifier").replace_strict(order, default=len(order)))
            .sort(pl.col("train_on") != "synthetic", "_o")
            .drop("_o")
        )

    def metrics(self) -> dict[str, float]:
        """Mean and std over all (classifier, repeat) pairs: 'utility/<metric>_mean|_std' for
        synthetic-trained classifiers, 'utility/real_<metric>_...' for the real reference."""
        out: dict[str, float] = {}
        for prefix, recs in (("", self.synthetic), ("real_", self.real)):
            if not recs:
                continue
            for m in METRICS:
                v = np.array([r[m] for r in recs], dtype=np.float64)
                ok = np.isfinite(v)
                out[f"utility/{prefix}{m}_mean"] = float(v[ok].mean()) if ok.any() else float("nan")
                out[f"utility/{prefix}{m}_std"] = float(v[ok].std()) if ok.any() else float("nan")
        return out


def utility(
    schema: Schema,
    synthetic: pl.DataFrame,
    real_train: pl.DataFrame | None,
    real_test: pl.DataFrame,
    repeats: int = 1,
    seed: int = 0,
    max_train_rows: int = 20_000,
) -> UtilityResult:
    """Train-on-synthetic / test-on-real scores, and train-on-real reference if `real_train` is given."""
    syn = classify(schema, synthetic, real_test, repeats, seed, max_train_rows)
    real = classify(schema, real_train, real_test, repeats, seed, max_train_rows) if real_train is not None else None
    return UtilityResult(synthetic=syn, real=real)
