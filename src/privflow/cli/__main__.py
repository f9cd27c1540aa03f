"""`python -m privflow.cli`: the console script's entry point."""

from privflow.cli import main

if __name__ == "__main__":
    main()
