"""Pipeline steps, plain functions (no Prefect here): thin wrappers over privflow/, models/ and
privacy/; `fit.py` is the one training pipeline (plan -> DP statistics -> [DP prior] -> DP-SGD ->
Report-Noisy-Max), `mlflow_store.py` everything MLflow. A flow runs a step as a Prefect task
with the options flows/steps.py gives it; a function here that chains steps calls each through
the runner it is handed (core/steps.py, `StepRunner`).

Steps that touch private rows never persist or cache their results under Prefect (flows/steps.py,
`private=True`: no raw rows in a result store). A mechanism step that retries reserves its extra
attempt in the ledger under its own id before it runs again (tasks/promote.py, `attempt_run_id` in
privacy/ledger/store.py).
"""
