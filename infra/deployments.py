"""Every privflow deployment, declared in one place, apart from the flow code.

    python -m infra.deployments serve                      # run them in this process (no worker)
    python -m infra.deployments deploy --pool privflow     # register them for a process worker
    python -m infra.deployments deploy --pool privflow-gpu --image REGISTRY/privflow:TAG
                                                           # ... or for the Kubernetes GPU pool

Three deployments, the third only when a scoring folder is set:

* `privflow-train/scheduled`: the training flow (`flows.train.train_pipeline`) on a cron
  schedule, on a fixed training file.
* `privflow-retrain/on-new-data`: the retraining flow (`flows.retrain.retrain_on_new_data`),
  started by a deployment trigger on the custom event `privflow.data.arrived` that
  `python -m privflow.flows.watch` emits for each new file of the watched folder; the trigger passes
  the event's resource id (the file's absolute path) as `data_path`. Open-source Prefect
  events and automations only (no webhooks).
* `privflow-score/score-new-file`: the scoring flow (`flows.score.score_new_file`) on each new
  file of a folder of its own (PRIVFLOW_SCORE_DIR), under a released model
  (PRIVFLOW_SCORE_MODEL) and a public threshold (PRIVFLOW_SCORE_THRESHOLD): no privacy spent.

Site settings come from flags or the environment (flags win): PRIVFLOW_SCHEMA,
PRIVFLOW_WATCH_DIR, PRIVFLOW_STORE, PRIVFLOW_CONFIG, PRIVFLOW_TRAIN_DATA, PRIVFLOW_CRON,
PRIVFLOW_PROMOTION_EPSILON. Entrypoints are module paths (`flows.retrain.retrain_on_new_data`):
the package is installed wherever a flow runs (the container image, the venv), so no
source has to be pulled.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

EVENT = "privflow.data.arrived"  # flows.watch.EVENT (kept literal: importing flows pulls in torch)
FOLDER_LABEL = "privflow.folder"  # flows.watch.FOLDER_LABEL
TRAIN_DEPLOYMENT = "scheduled"
RETRAIN_DEPLOYMENT = "on-new-data"


def _demo(name: str) -> Path:
    return Path(str(resources.files("privflow") / "demo" / name))


@dataclass(frozen=True)
class Site:
    """An operator's choices: one dataset (schema), where its new files land, the store."""

    schema: Path
    watch_folder: Path
    store: Path
    config: Path | None = None
    train_data: Path | None = None
    cron: str = "0 3 * * 0"  # Sundays 03:00
    timezone: str = "UTC"
    promotion_epsilon: float = 0.05
    limit: int = 1  # flow runs at a time in `serve` (a 2-core box trains one model at a time)

    @classmethod
    def from_env(cls, **overrides: Any) -> Site:
        env = os.environ
        values: dict[str, Any] = {
            "schema": Path(env.get("PRIVFLOW_SCHEMA", _demo("adult.yaml"))),
            "watch_folder": Path(env.get("PRIVFLOW_WATCH_DIR", "data/incoming")),
            "store": Path(env.get("PRIVFLOW_STORE", ".privflow")),
            "config": Path(env["PRIVFLOW_CONFIG"]) if env.get("PRIVFLOW_CONFIG") else None,
            "train_data": Path(env.get("PRIVFLOW_TRAIN_DATA", _demo("adult_train.csv"))),
            "cron": env.get("PRIVFLOW_CRON", cls.cron),
            "promotion_epsilon": float(env.get("PRIVFLOW_PROMOTION_EPSILON", cls.promotion_epsilon)),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        site = cls(**values)
        return replace(
            site,
            schema=site.schema.expanduser().resolve(),
            watch_folder=site.watch_folder.expanduser().resolve(),
            store=site.store.expanduser().resolve(),
            config=site.config.expanduser().resolve() if site.config else None,
            train_data=site.train_data.expanduser().resolve() if site.train_data else None,
        )


def retrain_trigger(site: Site) -> Any:
    """`privflow.data.arrived` from this site's folder -> one retraining run per file."""
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

    return DeploymentEventTrigger(
        name=f"privflow-data-arrived:{site.watch_folder}",
        description="A new data file landed in the watched folder (python -m privflow.flows.watch).",
        expect={EVENT},
        match={FOLDER_LABEL: str(site.watch_folder)},
        for_each={"prefect.resource.id"},
        parameters={"data_path": "{{ event.resource.id }}"},
    )


# -- scoring each new file: a third deployment when PRIVFLOW_SCORE_DIR is set -------------------

SCORE_DEPLOYMENT = "score-new-file"


@dataclass(frozen=True)
class ScoreSite:
    """Where files to score land (a folder of its own, apart from the retraining folder), the
    released model that scores them and its public threshold in nats (flows/score.py)."""

    folder: Path
    model: str
    threshold: float

    @classmethod
    def from_env(cls) -> ScoreSite | None:
        """PRIVFLOW_SCORE_DIR, PRIVFLOW_SCORE_THRESHOLD (needed with it) and PRIVFLOW_SCORE_MODEL
        (default privflow-adult@champion); None when no scoring folder is set."""
        env = os.environ
        if not env.get("PRIVFLOW_SCORE_DIR"):
            return None
        if not env.get("PRIVFLOW_SCORE_THRESHOLD"):
            raise ValueError("PRIVFLOW_SCORE_DIR is set without PRIVFLOW_SCORE_THRESHOLD (a public threshold, nats).")
        folder = Path(env["PRIVFLOW_SCORE_DIR"]).expanduser().resolve()
        model = env.get("PRIVFLOW_SCORE_MODEL", "privflow-adult@champion")
        return cls(folder, model, float(env["PRIVFLOW_SCORE_THRESHOLD"]))


def score_trigger(scoring: ScoreSite) -> Any:
    """`privflow.data.arrived` from the scoring folder -> one scoring run per file."""
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

    return DeploymentEventTrigger(
        name=f"privflow-score-arrived:{scoring.folder}",
        description="A file to score landed in the scoring folder (python -m privflow.flows.watch).",
        expect={EVENT},
        match={FOLDER_LABEL: str(scoring.folder)},
        for_each={"prefect.resource.id"},
        parameters={"data_path": "{{ event.resource.id }}"},
    )


def score_deployments(site: Site, common: dict[str, Any], scoring: ScoreSite | None = None) -> list[Any]:
    """The scoring deployment (flows/score.py) when a scoring folder is configured, else none."""
    scoring = scoring if scoring is not None else ScoreSite.from_env()
    if scoring is None:
        return []
    if scoring.folder == site.watch_folder:
        raise ValueError(f"The scoring folder {scoring.folder} is the retraining folder: give scoring its own folder.")
    from privflow.flows.score import score_new_file

    return [
        score_new_file.to_deployment(
            name=SCORE_DEPLOYMENT,
            parameters={"model": scoring.model, "threshold": scoring.threshold, "store": str(site.store)},
            triggers=[score_trigger(scoring)],
            description="Score each new file under the released model (public threshold: no privacy spent).",
            **common,
        )
    ]


def training_config(site: Site) -> dict[str, Any]:
    """The scheduled run's RunConfig as JSON parameters (validated now, not at 03:00)."""
    from privflow.core.config import RunConfig

    if site.train_data is None:
        raise ValueError("The scheduled training deployment needs a training file (PRIVFLOW_TRAIN_DATA).")
    fixed = {"data": site.train_data, "schema_path": site.schema, "store": site.store}
    cfg = RunConfig.from_yaml(site.config, **fixed) if site.config else RunConfig.build(**fixed)
    return cfg.model_dump(mode="json")


def deployments(site: Site, work_pool: str | None = None, job_variables: dict[str, Any] | None = None) -> list[Any]:
    """The two RunnerDeployments (built offline; nothing is sent to a server here)."""
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    from privflow.flows.retrain import retrain_on_new_data
    from privflow.flows.train import train_pipeline

    common: dict[str, Any] = {"entrypoint_type": EntrypointType.MODULE_PATH, "tags": ["privflow"]}
    if work_pool is not None:
        common.update(work_pool_name=work_pool, job_variables=dict(job_variables or {}))
    train = train_pipeline.to_deployment(
        name=TRAIN_DEPLOYMENT,
        schedule=Cron(site.cron, timezone=site.timezone),
        parameters={"config": training_config(site), "show_progress": False},
        description="Scheduled DP training on the site's training file.",
        **common,
    )
    retrain = retrain_on_new_data.to_deployment(
        name=RETRAIN_DEPLOYMENT,
        parameters={
            "schema_path": str(site.schema),
            "config_path": str(site.config) if site.config else None,
            "store": str(site.store),
            "promotion_epsilon": site.promotion_epsilon,
        },
        triggers=[retrain_trigger(site)],
        description="Retrain, register and (by a DP comparison) promote when a new file arrives.",
        **common,
    )
    return [train, retrain, *score_deployments(site, common)]


def serve(site: Site) -> None:
    """Serve every deployment from this process (blocks; Ctrl-C or SIGTERM stops it)."""
    from prefect import serve as prefect_serve

    site.watch_folder.mkdir(parents=True, exist_ok=True)
    prefect_serve(*deployments(site), limit=site.limit)


def ensure_pool(name: str, pool_type: str = "process", base_job_template: dict[str, Any] | None = None) -> None:
    """Create the work pool if the server does not have it yet."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(
                WorkPoolCreate(name=name, type=pool_type, base_job_template=base_job_template or {})
            )


def deploy(site: Site, pool: str, image: str | None = None, job_variables: dict[str, Any] | None = None) -> list[str]:
    """Register every deployment on a work pool (a process pool is created if missing)."""
    if image is None:
        ensure_pool(pool, "process")
    ids = []
    for dep in deployments(site, work_pool=pool, job_variables=job_variables):
        ids.append(str(dep.apply(work_pool_name=pool, image=image)))
    return ids


def main(argv: list[str] | None = None) -> int:
    """The command line; a bad flag, file or cron expression is one line on stderr and status 2."""
    from privflow.core.errors import PrivflowError

    try:
        return _main(argv)
    except (ValueError, OSError, PrivflowError) as exc:  # pydantic's and Prefect's validation errors are ValueErrors
        print(f"error: {' '.join(str(exc).split())[:600]}", file=sys.stderr)
        return 2


def check_site(site: Site) -> None:
    """What a deployment would only find wrong when it runs: its schema and cron expression."""
    from prefect.client.schemas.schedules import CronSchedule

    if not site.schema.is_file():
        raise ValueError(f"schema '{site.schema}' is not a file (--schema or PRIVFLOW_SCHEMA)")
    if site.config is not None and not site.config.is_file():
        raise ValueError(f"config '{site.config}' is not a file (--config or PRIVFLOW_CONFIG)")
    try:
        CronSchedule(cron=site.cron, timezone=site.timezone)
    except ValueError:
        raise ValueError(
            f"'{site.cron}' is not a cron expression (--cron or PRIVFLOW_CRON), e.g. '0 3 * * 0'"
        ) from None


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.deployments", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["serve", "deploy", "show"])
    parser.add_argument("--schema", type=Path)
    parser.add_argument("--watch-folder", type=Path)
    parser.add_argument("--store", type=Path)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--train-data", type=Path)
    parser.add_argument("--cron")
    parser.add_argument("--pool", default="privflow", help="work pool (deploy)")
    parser.add_argument("--image", help="container image (deploy to a Kubernetes pool)")
    parser.add_argument("--gpus", type=int, help="GPUs per flow run (job variable gpu_count of the Kubernetes pool)")
    args = parser.parse_args(argv)
    if args.gpus is not None and args.gpus < 0:
        parser.error(f"--gpus must be 0 or more, got {args.gpus}")
    from privflow.core import env

    site = Site.from_env(
        schema=args.schema,
        watch_folder=args.watch_folder,
        store=args.store,
        config=args.config,
        train_data=args.train_data,
        cron=args.cron,
    )
    check_site(site)
    env.configure(site.store)
    if args.command == "serve":
        serve(site)
    elif args.command == "deploy":
        job_variables = {"gpu_count": args.gpus} if args.gpus is not None else None
        for dep_id in deploy(site, args.pool, args.image, job_variables):
            print(dep_id)
    else:
        for dep in deployments(site):
            print(f"{dep.flow_name}/{dep.name}: entrypoint {dep.entrypoint}")
            for s in dep.schedules or []:
                print(f"  schedule: {s.schedule}")
            for t in dep.triggers or []:
                print(f"  trigger: {sorted(t.expect)} match {t.match} -> parameters {t.parameters}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
