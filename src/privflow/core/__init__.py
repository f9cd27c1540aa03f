"""Configuration, errors, environment and process plumbing that every layer may use."""
