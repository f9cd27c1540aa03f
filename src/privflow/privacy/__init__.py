"""The privacy core: mechanisms with their events, accountants, the plan and the ledger.

Plain library: imports neither Prefect nor MLflow.
"""
