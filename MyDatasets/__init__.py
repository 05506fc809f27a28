"""Datasets: the classes that give a participant its inputs, plus small sample data."""
