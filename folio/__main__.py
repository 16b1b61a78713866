"""`python -m folio ...` is the `folio` command."""

from folio.entrypoints.cli.main import main

if __name__ == "__main__":
    main()
