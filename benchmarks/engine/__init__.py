"""Engine level: a model's tokens/s with Engram rows from engramd (e2e.py) on a dense decoder with
random weights (model.py), and its busy measures under every daemon rule the docs offer, one
session (busy_rules.py)."""
