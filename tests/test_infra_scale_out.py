"""The scale-out manifests under infra/: they parse, and what they say fits the code that runs.

- The torchrun training Job asks for as many GPUs as its `privflow run --workers N` starts
  workers (pre-flight refuses more workers than GPUs), never retries (a retry would spend
  epsilon again), hands rows over through TMPDIR on a pod-local emptyDir, and gives NCCL an
  in-memory /dev/shm; every flag it passes is an option of `privflow run`.
- The Dask benchmark: the sweep's --dask-address and the workers' scheduler address are the
  scheduler Service; one image everywhere (the client and the workers must run the same code
  and `distributed`); the sweep's arguments parse as the benchmark's command line and name
  real datasets and models.
- The Kubernetes GPU work-pool template keeps Job fields on the Job (not in the pod spec) and
  sets TMPDIR to a mounted emptyDir.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer.main
import yaml

from privflow.cli import app

INFRA = Path(__file__).resolve().parents[1] / "infra"


def _docs(name: str) -> dict[str, dict]:
    docs = list(yaml.safe_load_all((INFRA / "k8s" / name).read_text()))
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def test_training_job_requests_one_gpu_per_worker_and_a_private_scratch() -> None:
    job = _docs("train-workers-job.yaml")["Job/privflow-train-workers"]
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]
    assert args[:2] == ["privflow", "run"]
    flags = _flags(args)
    resources = container["resources"]
    assert int(flags["workers"]) == resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
    assert int(flags["workers"]) > 1 and flags["device"] == "cuda"
    run = next(c for c in typer.main.get_command(app).commands.values() if c.name == "run")  # type: ignore[attr-defined]
    options = {o for p in run.params for o in p.opts}
    assert {f"--{k}" for k in flags} <= options, {f"--{k}" for k in flags} - options
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    tmpdir = {e["name"]: e["value"] for e in container["env"]}["TMPDIR"]
    assert "emptyDir" in volumes[mounts[tmpdir]]  # the rows' hand-over folder lives and dies with the pod
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["name"] == "private")


def test_dask_sweep_reaches_the_scheduler_service_with_one_image() -> None:
    from benchmarks.cells import build_cells
    from benchmarks.sweep import parser, resolve

    docs = _docs("dask-benchmark.yaml")
    service = docs["Service/privflow-dask-scheduler"]
    address = f"tcp://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    scheduler = docs["Deployment/privflow-dask-scheduler"]["spec"]["template"]["spec"]["containers"][0]
    worker = docs["Deployment/privflow-dask-worker"]["spec"]["template"]["spec"]["containers"][0]
    sweep = docs["Job/privflow-benchmark-sweep"]["spec"]["template"]["spec"]["containers"][0]
    assert str(service["spec"]["ports"][0]["port"]) in scheduler["args"]
    assert worker["args"][:3] == ["dask", "worker", address]
    assert "--nthreads=1" in worker["args"]  # one cell per worker process at a time
    assert sweep["args"][:3] == ["python", "-m", "benchmarks.sweep"]
    args = parser().parse_args(sweep["args"][3:])
    assert args.task_runner == "dask" and args.dask_address == address
    picked = resolve(args)
    assert build_cells(picked["datasets"], picked["models"], picked["epsilons"], picked["seeds"])
    assert len({c["image"] for c in (scheduler, worker, sweep)}) == 1
    assert docs["Job/privflow-benchmark-sweep"]["spec"]["backoffLimit"] == 0
    dockerfile = (INFRA / "Dockerfile.bench").read_text()
    assert "pip install -e '.[bench]'" in dockerfile
    assert "PYTHONPATH=/opt/privflow" in dockerfile  # the workers import the checkout's `benchmarks` package


def test_gpu_pool_template_keeps_job_fields_on_the_job_and_a_scratch_tmpdir() -> None:
    template = json.loads((INFRA / "k8s" / "gpu-base-job-template.json").read_text())
    spec = template["job_configuration"]["job_manifest"]["spec"]
    pod = spec["template"]["spec"]
    assert spec["parallelism"] == spec["completions"] == 1 and spec["backoffLimit"] == 0
    assert not {"parallelism", "completions", "backoffLimit"} & set(pod)
    tmpdir = template["variables"]["properties"]["env"]["default"]["TMPDIR"]
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}[mounts[tmpdir]]
