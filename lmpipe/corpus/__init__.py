"""Corpus sources, cleaning and splitting."""
