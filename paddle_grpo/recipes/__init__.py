"""Recipes on top of the runtime: the quickstart policy, tiny models, Knights-and-Knaves generation, seq2seq build
recipes and data converters. Tools, tests and the command line import them; the runtime core never does."""
