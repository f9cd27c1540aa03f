"""privflow: differentially private normalizing flows for tabular data.

Its folders are its layers (docs/architecture.md, "Layout"), each importing only those below it:
cli/ and api.py (the `privflow` command and the Python API), flows/ (Prefect flows, and the
training chain they share with the in-process run), preflight/ (the checks made before anything
is spent), tasks/ and serving/ (the pipeline's steps, MLflow, the released sampler), models/ and
privacy/ (torch modules; the mechanisms, DP-SGD, the accountants and the ledger: a plain library
without Prefect or MLflow), data/ (the schema, the codec, the total reader, validation) and core/
(the run configuration, errors, the offline environment, the curator-only store); demo/ holds the
bundled data.
"""

__version__ = "0.1.0"
