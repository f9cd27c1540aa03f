"""The CLI: help for every command, and each kind of bad input gives one clear paragraph,
exit status 2, no traceback, and nothing trained, registered or charged to the ledger."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from privflow.cli import app

runner = CliRunner()
DEMO = Path(__file__).resolve().parents[2] / "src" / "privflow" / "demo"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["run", "--help"],
        ["generate", "--help"],
        ["demo", "--help"],
        ["ledger", "--help"],
        ["ledger", "show", "--help"],
    ],
)
def test_every_command_has_help(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 2) and "Usage" in result.output
    if args:
        assert result.exit_code == 0


@pytest.fixture()
def small(tmp_path: Path, demo_dir: Path) -> dict[str, Path]:
    """A 400-row slice of Adult, its schema, and a store folder."""
    df = pl.read_csv(demo_dir / "adult_train.csv", infer_schema=False, n_rows=400)
    data = tmp_path / "adult.csv"
    df.write_csv(data)
    schema = tmp_path / "adult.yaml"
    shutil.copy(demo_dir / "adult.yaml", schema)
    return {"data": data, "schema": schema, "store": tmp_path / "store", "dir": tmp_path, "frame": df}


def _run(small: dict[str, Path], data: Path | None = None, schema: Path | None = None, *extra: str):
    return runner.invoke(
        app,
        [
            "run",
            "--data",
            str(data or small["data"]),
            "--schema",
            str(schema or small["schema"]),
            "--store",
            str(small["store"]),
            "--quiet",
            *extra,
        ],
    )


def _assert_user_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())
    for needle in needles:
        assert needle.lower() in text.lower(), text


def _nothing_registered(store: Path) -> None:
    ledger = store / "ledger.db"
    if ledger.exists():
        from privflow.privacy.ledger import Ledger

        spent, _ = Ledger(ledger).spent("adult")
        assert spent == 0.0
    db = store / "mlflow.db"
    if db.exists():
        import sqlite3

        with sqlite3.connect(db) as con:
            assert con.execute("select count(*) from model_versions").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("epsilon", "delta", "needle"),
    [("0", "1e-5", "epsilon"), ("-1", "1e-5", "epsilon"), ("1", "0", "delta"), ("1", "1.5", "delta")],
)
def test_bad_privacy_parameters(small, epsilon: str, delta: str, needle: str) -> None:
    result = _run(small, None, None, "--epsilon", epsilon, "--delta", delta)
    _assert_user_error(result, needle)
    _nothing_registered(small["store"])


def test_schema_that_does_not_parse(small) -> None:
    bad = small["dir"] / "bad.yaml"
    bad.write_text("dataset: {name: adult\ncolumns: [")
    _assert_user_error(_run(small, None, bad), "not valid YAML")


def test_schema_with_unknown_type(small) -> None:
    doc = yaml.safe_load(small["schema"].read_text())
    doc["columns"][0]["type"] = "timestamp"
    bad = small["dir"] / "unknown.yaml"
    bad.write_text(yaml.safe_dump(doc))
    _assert_user_error(_run(small, None, bad), "invalid", "type")


def test_missing_data_file(small) -> None:
    _assert_user_error(_run(small, small["dir"] / "nope.csv"), "nope.csv")


class TestStreamRefusedBeforeTheFlow:
    """--stream reads uncompressed Parquet in one process: anything else is refused by pre-flight,
    before the ledger reserves."""

    @pytest.fixture()
    def parquet(self, small) -> Path:
        ints = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
        path = small["dir"] / "adult.parquet"
        small["frame"].with_columns(pl.col(c).str.strip_chars().cast(pl.Int64) for c in ints).write_parquet(path)
        return path

    def test_csv(self, small) -> None:
        _assert_user_error(_run(small, None, None, "--stream"), "uncompressed Parquet", "--stream")
        _nothing_registered(small["store"])

    def test_gzipped_parquet(self, small, parquet: Path) -> None:
        """The fix for a gzipped Parquet file is to decompress it, not to convert it from CSV."""
        import gzip

        packed = parquet.with_name("adult.parquet.gz")
        packed.write_bytes(gzip.compress(parquet.read_bytes()))
        result = _run(small, packed, None, "--stream")
        _assert_user_error(result, "uncompressed Parquet", "gunzip -k")
        assert "scan_csv" not in result.output
        _nothing_registered(small["store"])

    def test_workers(self, small, parquet: Path) -> None:
        _assert_user_error(_run(small, parquet, None, "--stream", "--workers", "2"), "one process")
        _nothing_registered(small["store"])


class TestBadDataBeforeTheFlow:
    """File-level problems are found by pre-flight, before Prefect starts or the ledger reserves."""

    def test_missing_column(self, small) -> None:
        path = small["dir"] / "missing.csv"
        small["frame"].drop("age").write_csv(path)
        _assert_user_error(_run(small, path), "age")
        _nothing_registered(small["store"])

    def test_extra_column(self, small) -> None:
        path = small["dir"] / "extra.csv"
        small["frame"].with_columns(pl.lit("x").alias("shoe_size")).write_csv(path)
        _assert_user_error(_run(small, path), "shoe_size")
        _nothing_registered(small["store"])

    def test_empty_file(self, small) -> None:
        path = small["dir"] / "empty.csv"
        path.write_text("")
        _assert_user_error(_run(small, path), "empty")
        _nothing_registered(small["store"])

    def test_not_csv_or_parquet(self, small) -> None:
        path = small["dir"] / "table.xlsx"
        path.write_bytes(b"PK\x03\x04 not a table")
        _assert_user_error(_run(small, path), "table.xlsx")
        _nothing_registered(small["store"])

    def test_over_budget_is_refused_before_reading(self, small) -> None:
        doc = yaml.safe_load(small["schema"].read_text())
        doc["dataset"]["budget"]["epsilon"] = 0.5
        tight = small["dir"] / "tight.yaml"
        tight.write_text(yaml.safe_dump(doc))
        refused = _run(small, None, tight, "--epsilon", "1")
        assert refused.exit_code == 4, refused.output  # the ledger's refusal: ExitStatus.BUDGET
        assert "Traceback" not in refused.output
        text = " ".join(refused.output.split())
        assert all(needle in text for needle in ("budget", "spent", "ledger show")), text
        _nothing_registered(small["store"])


def test_promote_values_map_to_the_config() -> None:
    from privflow.cli import promotion_rule
    from privflow.core.config import RunConfig

    for flag in ("if-better", "always", "never"):
        value = promotion_rule(flag)
        RunConfig.build(data="x.csv", schema_path="s.yaml", promotion=value)  # accepted by the config
    assert promotion_rule(None) is None


def _run_summary(**fields: object) -> object:
    """A run summary as `print_summary` reads it: a plain run's fields, with `fields` on top."""
    from types import SimpleNamespace

    base = {
        "epsilon": 0.99, "delta": 1e-5, "epsilon_rdp": 1.2, "stages": {"train": 0.9}, "dataset_epsilon": 2.0,
        "dataset_delta": 1e-6, "metrics": {}, "rows_quarantined": 0, "wall_seconds": 1.0,
        "model_name": "privflow-adult", "model_version": "3", "alias": "champion", "alias_version": "2",
        "promotion": "the DP comparison kept v2", "curator_dir": "/curator/run", "synthetic_path": "/s.csv",
        "report_path": None, "mlflow_run_id": "abc", "run_id": "r1",
    }  # fmt: skip
    return SimpleNamespace(**{**base, **fields})


def test_summary_prints_every_path_in_full(capsys) -> None:
    from privflow.cli import print_summary

    long = "/very/long/" + "x" * 150 + "/synthetic/adult-0123.csv"
    print_summary(_run_summary(synthetic_path=long))
    out = capsys.readouterr().out
    assert long in out
    assert "registered model privflow-adult v3" in out
    assert "alias @champion -> v2 (the DP comparison kept v2)" in out
    assert "/curator/run" in out
    # the dataset's total is stated at the budget's delta, which is not this run's
    assert "0.9900 at delta=1e-05" in out and "2.0000 at delta=1e-06" in out


def test_summary_of_a_private_warm_start_heads_with_the_lineages_epsilon(capsys) -> None:
    """Privacy rule 9: the version's epsilon is its private chain's; the run's own is labelled."""
    from privflow.cli import print_summary

    summary = _run_summary(
        epsilon=1.3432, epsilon_run=0.9929, delta_run=1e-5, lineage="m/1 -> m/2", lineage_runs=("r1", "r2"),
        init_from="m/1", epsilon_rdp=1.1, dataset_epsilon=1.5, dataset_delta=1e-5, model_name="m", model_version="2",
    )  # fmt: skip
    print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())
    assert "epsilon (PLD, reported, lineage of 2 runs) │ 1.3432 at delta=1e-05" in out, out
    assert "m/1 -> m/2" in out and "epsilon (this run alone, PLD) │ 0.9929 at delta=1e-05" in out, out


def test_summary_labels_rdp_as_a_looser_bound_not_the_spend(capsys) -> None:
    """RDP's figure may exceed the requested epsilon (1.2 above 0.99 here): it must not read as a spend."""
    from privflow.cli import print_summary

    print_summary(_run_summary())
    out = " ".join(capsys.readouterr().out.split())
    assert "RDP bound (this run alone) │ 1.2000 (looser cross-check; the PLD" in out, out  # the value folds
    assert "figure is the spend)" in out
    assert "RDP cross-check)" not in out


def test_summary_says_where_to_see_the_prefect_flow_run(capsys, monkeypatch) -> None:
    from privflow.cli import print_summary
    from privflow.cli.summary import prefect_ui_url

    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    print_summary(_run_summary())  # in process: no Prefect line
    assert "Prefect" not in capsys.readouterr().out
    monkeypatch.setenv("PREFECT_HOME", "/store/prefect")
    print_summary(_run_summary(), prefect=True)  # --engine prefect without an API: a temporary server
    out = " ".join(capsys.readouterr().out.split())
    assert "temporary local Prefect server that stops when this command exits" in out, out
    assert "/store/prefect" in out and "`prefect server start`" in out
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api" in out
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect-server:4200/api")
    print_summary(_run_summary(), prefect=True)
    out = " ".join(capsys.readouterr().out.split())
    assert "see it in the UI at http://prefect-server:4200 (Runs)" in out and "temporary" not in out, out
    cloud = "https://api.prefect.cloud/api/accounts/a1/workspaces/w2"
    assert prefect_ui_url(cloud) == "https://app.prefect.cloud/account/a1/workspace/w2"


def test_ledger_show_without_ledger(tmp_path: Path) -> None:
    result = runner.invoke(app, ["ledger", "show", "--store", str(tmp_path)])
    _assert_user_error(result, "No ledger")


def test_ledger_show_of_a_dataset_the_ledger_does_not_hold(tmp_path: Path) -> None:
    from privflow.privacy.ledger import Ledger

    Ledger(tmp_path / "ledger.db")
    result = runner.invoke(app, ["ledger", "show", "nope", "--store", str(tmp_path)])
    _assert_user_error(result, "'nope' is not in the privacy ledger")
    assert "holds no dataset yet" in result.output


@pytest.mark.parametrize(
    ("device", "expect"),
    [("cuda", ["cuda", "--device cpu"]), ("gpu", ["--device", "'gpu' is not one of 'auto', 'cpu', 'cuda'"])],
)
def test_generate_refuses_a_device_it_cannot_use_before_opening_the_store(
    tmp_path: Path, device: str, expect: list[str]
) -> None:
    """`generate --device cuda` without CUDA (or a device that does not exist) is a user error:
    one paragraph, exit 2, and the store is never created."""
    if device == "cuda" and Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    store = tmp_path / "store"
    args = ["generate", "--model", "m@a", "-n", "10", "-o", str(tmp_path / "o.csv"), "--store", str(store)]
    result = runner.invoke(app, [*args, "--device", device])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.translate(str.maketrans("", "", "│╭╮╰╯─")).split())  # click's usage error, unboxed
    assert all(e in text for e in expect) and "Traceback" not in result.output, text
    assert not store.exists()


def _under_a_file(tmp_path: Path) -> str:
    (tmp_path / "plain").write_text("x")
    return str(tmp_path / "plain" / "rows.csv")


@pytest.mark.parametrize(
    ("command", "out", "extra", "expect"),
    [
        ("generate", lambda t: str(t / "rows.txt"), [], ["must end in .csv or .parquet"]),
        ("generate", lambda t: (t / "d.csv").mkdir() or str(t / "d.csv"), [], ["is a folder"]),
        ("generate", _under_a_file, [], ["is a file, not a folder"]),
        ("generate", lambda t: "/proc/privflow-rows.csv", [], ["does not take new files"]),
        ("generate", lambda t: str(t / "rows.csv"), ["--seed", str(2**64)], ["--seed", "2**63 - 1"]),
        ("generate", lambda t: str(t / "rows.csv"), ["--seed", "-1"], ["--seed"]),
        ("score", _under_a_file, ["--data", "x.csv", "--threshold", "-5"], ["is a file, not a folder"]),
    ],
)
def test_output_and_seed_mistakes_are_refused_before_the_model_is_loaded(
    tmp_path: Path, command: str, out, extra: list[str], expect: list[str]
) -> None:
    """A table that could not be written (or an out-of-range seed) is a user error: exit 2, one
    paragraph, before the store is opened (so no model needs to exist)."""
    target = out(tmp_path)
    if target.startswith("/proc/") and not Path("/proc/self").exists():
        pytest.skip("no /proc on this machine")
    store = tmp_path / "store"
    args = [command, "--model", "m@a", "-o", target, "--store", str(store), *extra]
    if command == "generate":
        args += ["-n", "10"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert all(e in result.output for e in expect) and "Traceback" not in result.output
    assert not store.exists()


@pytest.mark.parametrize("store_kind", ["missing", "file"])
def test_generate_and_score_refuse_a_store_without_a_registry_and_create_nothing(
    tmp_path: Path, store_kind: str
) -> None:
    """A mistyped --store is an error, not a new empty store (nor a Prefect home inside it)."""
    store = tmp_path / "store"
    if store_kind == "file":
        store.write_text("x")
    out = str(tmp_path / "o.csv")
    gen = runner.invoke(app, ["generate", "--model", "m@a", "-n", "5", "-o", out, "--store", str(store)])
    scored = runner.invoke(
        app, ["score", "--model", "m@a", "--data", str(DEMO / "adult_test.csv"), "-o", out, "--threshold", "1",
              "--store", str(store)],
    )  # fmt: skip
    needle = "no model registry in the store" if store_kind == "missing" else "is a file, not a folder"
    for result in (gen, scored):
        _assert_user_error(result, needle)
    assert not store.exists() if store_kind == "missing" else store.read_text() == "x"


def test_a_ledger_that_is_not_a_database_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "ledger.db").write_text("not a sqlite db")
    for args in (
        ["ledger", "show", "--store", str(tmp_path)],
        [
            "run",
            "--data",
            str(DEMO / "adult_train.csv"),
            "--schema",
            str(DEMO / "adult.yaml"),
            "--store",
            str(tmp_path),
        ],
    ):
        _assert_user_error(runner.invoke(app, args), "cannot be opened as a SQLite database", "restore it")
    assert (tmp_path / "ledger.db").read_text() == "not a sqlite db"


def test_ledger_show_names_what_is_wrong_with_the_store(tmp_path: Path) -> None:
    """A store that is a file, a ledger.db that is a folder, and another program's SQLite file
    (which privflow used to write its tables into) are each named as what they are."""
    import sqlite3

    as_file = tmp_path / "store-file"
    as_file.write_text("x")
    _assert_user_error(runner.invoke(app, ["ledger", "show", "--store", str(as_file)]), "is a file, not a folder")
    folder = tmp_path / "folder-store"
    (folder / "ledger.db").mkdir(parents=True)
    _assert_user_error(runner.invoke(app, ["ledger", "show", "--store", str(folder)]), "is a folder, not a privacy")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with sqlite3.connect(foreign / "ledger.db") as con:
        con.execute("CREATE TABLE invoices (id INTEGER)")
    _assert_user_error(
        runner.invoke(app, ["ledger", "show", "--store", str(foreign)]), "not a privacy ledger", "invoices"
    )
    with sqlite3.connect(foreign / "ledger.db") as con:
        assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["invoices"]  # untouched


def test_ledger_set_budget_raises_a_datasets_budget_on_purpose(tmp_path: Path) -> None:
    """The refusal's advice is a command: `privflow ledger set-budget` (the schema alone can only
    lower a budget). Bad values and unknown datasets are user errors."""
    from privflow.privacy.accounting.events import GaussianEvent
    from privflow.privacy.ledger import Ledger

    ledger = Ledger(tmp_path / "ledger.db")
    ledger.ensure_dataset("adult", 1.0, 1e-5)
    ledger.reserve("adult", "r1", [GaussianEvent(5.0)])
    ledger.settle("r1", [GaussianEvent(5.0)])
    result = runner.invoke(app, ["ledger", "set-budget", "adult", "--epsilon", "4", "--store", str(tmp_path)])
    assert result.exit_code == 0 and "budget epsilon=4" in result.output, result.output
    (record,) = ledger.datasets()
    assert (record.budget_epsilon, record.budget_delta) == (4.0, 1e-5)
    assert "set on purpose" in ledger.notes("adult")[-1][2]
    for args, needle in (
        (["census", "--epsilon", "4"], "not in the privacy ledger"),
        (["adult", "--epsilon", "0"], "--epsilon"),
        (["adult", "--epsilon", "2", "--delta", "1"], "--delta"),
    ):
        _assert_user_error(runner.invoke(app, ["ledger", "set-budget", *args, "--store", str(tmp_path)]), needle)
    assert ledger.datasets()[0].budget_epsilon == 4.0
    # a total, like the schema's budget: above a single run's limit of 100 is accepted (it was
    # refused although the schema had set 1,000), and one below what is spent is noted
    big = runner.invoke(app, ["ledger", "set-budget", "adult", "--epsilon", "1000", "--store", str(tmp_path)])
    assert big.exit_code == 0 and ledger.datasets()[0].budget_epsilon == 1000.0, big.output
    assert "note:" not in big.output
    spent = ledger.spent("adult")[0]
    low = runner.invoke(app, ["ledger", "set-budget", "adult", "--epsilon", f"{spent / 2:g}", "--store", str(tmp_path)])
    assert low.exit_code == 0 and "already spent" in low.output and "no further run" in low.output, low.output


def test_a_ledger_on_a_full_or_failing_disk_is_not_called_damaged(tmp_path: Path, monkeypatch) -> None:
    """SQLite's 'disk I/O error' (seen with the store on a full disk) is the machine's state: the
    message says to free space, not to restore the ledger from a backup."""
    import sqlite3

    from privflow.privacy.ledger import Ledger

    def failing(self):  # noqa: ANN001
        raise sqlite3.OperationalError("disk I/O error")

    (tmp_path / "ledger.db").touch()
    monkeypatch.setattr(Ledger, "_connect", failing)
    result = runner.invoke(app, ["ledger", "show", "--store", str(tmp_path)])
    _assert_user_error(result, "disk I/O error", "may be full or failing", "free some space")
    assert "backup" not in result.output


def test_score_will_not_write_over_its_own_input(tmp_path: Path) -> None:
    table = tmp_path / "rows.csv"
    table.write_text((DEMO / "adult_test.csv").read_text())
    before = table.read_text()
    result = runner.invoke(
        app, ["score", "--model", "m@a", "--data", str(table), "-o", str(table), "--threshold", "1", "--store",
              str(tmp_path / "store")],
    )  # fmt: skip
    _assert_user_error(result, "is the --data table itself")
    assert table.read_text() == before


@pytest.mark.parametrize(("command", "spends"), [("generate", False), ("run", True)])
def test_an_interrupted_command_mentions_the_ledger_only_when_it_can_spend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, spends: bool
) -> None:
    """Ctrl-C exits 130 with one line; `generate` spends nothing, so it no longer says that privacy
    already spent stays in the ledger (fuzzing round 6), while `run` still does."""
    import privflow.cli.generate
    import privflow.cli.run

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    if command == "generate":
        monkeypatch.setattr(privflow.cli.generate, "_generate", interrupted)
    else:
        monkeypatch.setattr(privflow.cli.run, "_run_body", interrupted)
    args = {
        "generate": ["generate", "--model", "m@a", "-n", "5", "-o", str(tmp_path / "o.csv")],
        "run": ["run", "--data", "d.csv", "--schema", "s.yaml", "--engine", "local"],
    }[command]
    result = runner.invoke(app, [*args, "--store", str(tmp_path / "store")])
    assert result.exit_code == 130, result.output
    assert "interrupted (Ctrl-C)" in result.output
    assert ("stays recorded in the ledger" in result.output) is spends


def test_a_schema_can_turn_the_promotion_charge_off_for_its_dataset(tmp_path: Path) -> None:
    """`dataset.promotion`: the runs' default when neither --promote nor the config's
    `promotion` says otherwise; pre-flight applies it, an explicit setting wins."""
    from privflow.core.config import RunConfig
    from privflow.core.errors import SchemaError
    from privflow.data.schema import Schema
    from privflow.preflight import preflight

    spec = yaml.safe_load((DEMO / "adult.yaml").read_text())
    assert Schema.from_yaml(DEMO / "adult.yaml").dataset.promotion == "if_better"  # the default
    for value, expected in (("never", "never"), ("If-Better", "if_better"), ("always", "always")):
        spec["dataset"]["promotion"] = value
        (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
        assert Schema.from_yaml(tmp_path / "s.yaml").dataset.promotion == expected
    spec["dataset"]["promotion"] = "sometimes"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(SchemaError, match="promotion"):
        Schema.from_yaml(tmp_path / "bad.yaml")

    spec["dataset"]["promotion"] = "never"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    common = {"data": str(DEMO / "adult_train.csv"), "schema_path": str(tmp_path / "s.yaml")}
    cfg = RunConfig.build(**common, store=str(tmp_path / "store"))
    assert cfg.promotion == "if_better" and preflight(cfg).config.promotion == "never"
    explicit = RunConfig.build(**common, store=str(tmp_path / "store"), promotion="if-better")  # --promote / config
    assert preflight(explicit).config.promotion == "if_better"


def test_preflight_line_states_the_promotion_comparisons_epsilon() -> None:
    """The pre-flight line's total: the plan's, plus the DP comparison's own epsilon (the
    mechanism's setting, not a copy) when `if-better` may run it."""
    from types import SimpleNamespace

    from privflow.cli.run import _plan_total
    from privflow.core.config import RunConfig
    from privflow.privacy.mechanisms.promotion import PromotionMechanism
    from privflow.tasks.promote import PromotionSettings

    plan = SimpleNamespace(epsilon=0.9931, delta=1e-5)
    cfg = RunConfig.build(data="x.csv", schema_path="s.yaml")
    text = _plan_total(plan, cfg)
    eps = PromotionMechanism().epsilon
    assert PromotionSettings(alias="champion").epsilon == eps  # what the pipeline's comparison spends
    assert text.startswith("plan epsilon=0.9931 at delta=1e-05")
    assert f"plus up to epsilon={eps:g} for the promotion comparison if a version already holds @champion" in text
    assert "--promote never" in text
    never = _plan_total(plan, RunConfig.build(data="x.csv", schema_path="s.yaml", promotion="never"))
    assert "plus" not in never and "no DP comparison" in never


def _ledger_with_prints(store: Path):
    """A ledger whose dataset 'bank' has a settled DP draft with its rows' digests, a generated
    table of bank-model/1 and a public declaration."""
    import numpy as np

    from privflow.privacy.accounting.events import LaplaceEvent
    from privflow.privacy.fingerprint import digests_blob
    from privflow.privacy.ledger import Ledger

    ledger = Ledger(store / "ledger.db")
    ledger.ensure_dataset("bank", 10.0, 1e-5)
    ledger.reserve("bank", "schema-draft-1", [LaplaceEvent(1.0)])
    ledger.settle("schema-draft-1", [LaplaceEvent(1.0)])
    blob = digests_blob(np.arange(1, 121, dtype="<u8") * 0x9E3779B97F4A7C15)
    ledger.record_rows("charged", "bank", blob, "blake2b-rows:feedfacefeedface", "schema-draft-1")
    ledger.record_rows("generated", "bank", blob[:400], "blake2b-rows:0ddba11", "schema-draft-1", "bank-model", "1")
    ledger.declare_public("pre", "1", "sha256:abc", "hmac-sha256:abc", "bank")
    return ledger


def test_ledger_curator_notes_lists_what_the_ledger_holds_without_a_digest(tmp_path: Path) -> None:
    _ledger_with_prints(tmp_path)
    result = runner.invoke(app, ["ledger", "curator-notes", "--store", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "CURATOR ONLY" in text and "no curator-only notes" not in text
    assert "dataset bank (curator-only):" in text
    assert "charged runs with keyed row digests: 1" in text and "schema-draft-1" in text and "120 rows" in text
    assert "generated tables of bank-model/1: 1 (50 rows in all" in text
    assert "declared public: pre/1" in text
    assert "feedface" not in text and "0ddba11" not in text and "abc" not in text  # counts and dates only
    empty = tmp_path / "empty"
    from privflow.privacy.ledger import Ledger

    Ledger(empty / "ledger.db").ensure_dataset("bank", 10.0, 1e-5)
    none = runner.invoke(app, ["ledger", "curator-notes", "bank", "--store", str(empty)])
    assert none.exit_code == 0 and "no curator-only notes for dataset 'bank'" in none.output


def test_ledger_rename_moves_a_dataset_and_its_draft_run_still_resolves(tmp_path: Path, demo_dir: Path) -> None:
    from privflow.core.config import RunConfig
    from privflow.data.schema import Schema
    from privflow.preflight import check_draft_run

    ledger = _ledger_with_prints(tmp_path)
    ledger.ensure_dataset("other", 10.0, 1e-5)
    spent = ledger.spent("bank")
    refused = runner.invoke(app, ["ledger", "rename", "bank", "other", "--store", str(tmp_path)])
    _assert_user_error(refused, "'other' is already in the privacy ledger", "nothing was changed")
    bad = runner.invoke(app, ["ledger", "rename", "bank", "no way", "--store", str(tmp_path)])
    _assert_user_error(bad, "may hold only letters")
    done = runner.invoke(app, ["ledger", "rename", "bank", "bank_v2", "--store", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert sorted(d.name for d in ledger.datasets()) == ["bank_v2", "other"]
    assert [r.run_id for r in ledger.runs("bank_v2")] == ["schema-draft-1"] and ledger.spent("bank_v2") == spent
    assert {p.dataset for p in ledger.row_prints()} == {"bank_v2"}
    assert ledger.public_source("pre", "1").dataset == "bank_v2"
    assert [m for *_, m in ledger.notes("bank_v2")] == [
        "dataset renamed from 'bank' to 'bank_v2' (privflow ledger rename); runs and budget kept"
    ]
    doc = yaml.safe_load((demo_dir / "adult.yaml").read_text())
    doc["dataset"].update(name="bank_v2", draft_run="schema-draft-1")
    schema_path = tmp_path / "bank.yaml"
    schema_path.write_text(yaml.safe_dump(doc))
    config = RunConfig.build(data="x.csv", schema_path=schema_path, store=tmp_path)
    check_draft_run(config, Schema.from_yaml(schema_path))  # resolves under the new name
    gone = runner.invoke(app, ["ledger", "rename", "bank", "bank_v3", "--store", str(tmp_path)])
    _assert_user_error(gone, "'bank' is not in the privacy ledger")
