"""Train, validate, test or predict from the command line; same as the `vit-train` command."""

from vit.commands.train import main

if __name__ == "__main__":
    main()
