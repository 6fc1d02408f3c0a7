"""`python -m engramd`: the command line."""
from .cli import main

main()
