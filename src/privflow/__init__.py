"""privflow: differentially private normalizing flows for tabular data.

This package holds what sits beside the library folders (models/, privacy/) and the
pipeline folders (tasks/, flows/): the dataset schema, the run configuration, the
schema-only codec, file I/O, the offline environment and the CLI.
"""

__version__ = "0.1.0"
