"""Iterated (two-stage) ERM: sharp asymptotics of a second ERM whose loss reads the first's predictions."""
