"""Thresholds for statistical tests on draws that cannot be seeded (OpenDP's exact samplers,
the secret generators of privacy/noise.py): such a test fails by chance with probability
equal to its threshold on every CI run. At 0.01 a dozen of them failed one run in twenty;
at FALSE_ALARM they never do, and each keeps its power through its sample size and a check
that a 10% wrong law is rejected."""

FALSE_ALARM = 1e-6
