"""The commands, one module each; `cli/app.py` registers them, in the order `--help` lists them."""
