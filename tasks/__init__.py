"""Prefect tasks: one pipeline step each, thin wrappers over privflow/, models/ and privacy/.

Tasks that touch private rows never persist or cache their results (no raw rows in a
result store), and mechanism tasks reserve any extra attempt in the ledger before they
run again (tasks/budget.py).
"""
