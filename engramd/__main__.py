"""`python -m engramd`: the command line."""
from .cli.main import main

main()
