"""Pipeline steps, Prefect tasks when a flow runs them (`lazy_task.py`): thin wrappers over
privflow/, models/ and privacy/; `fit.py` is the one training pipeline (plan -> DP statistics
-> [DP prior] -> DP-SGD -> Report-Noisy-Max), `mlflow_store.py` everything MLflow.

Tasks that touch private rows never persist or cache their results (`task(private=True)`: no
raw rows in a result store). A mechanism task that retries reserves its extra attempt in the
ledger under its own id before it runs again (tasks/promote.py, `attempt_run_id` in privacy/ledger/store.py).
"""
