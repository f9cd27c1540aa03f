"""Public numeric limits that the configuration validates against and the mechanisms enforce,
kept apart from the run configuration so that privacy/ can use them without importing it."""

MAX_NATS = 1e6  # score clipping bounds: their span is a sensitivity, and 1e308 made the noise's scale inf

__all__ = ["MAX_NATS"]
