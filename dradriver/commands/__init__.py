"""One module per `dradriver` subcommand; cli.py wires them."""
