"""Privacy events, the accountants that compose them, and the plan's calibration."""
