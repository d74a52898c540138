"""`python -m shardq.bin.cli`: the `shardq` command without its console script."""

from shardq.bin.cli.main import main

if __name__ == "__main__":
    main()
