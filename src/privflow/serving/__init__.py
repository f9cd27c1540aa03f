"""The released sampler: the MLflow pyfunc and the generation code it runs."""
