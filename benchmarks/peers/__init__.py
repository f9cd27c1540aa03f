"""MST and AIM (smartnoise-synth) beside privflow: ``driver`` runs in the project's environment,
``run_peer.py`` in the peers' own venv (.venv-peers, ``bash benchmarks/peers/setup.sh``)."""
